"""Which flash kernels exist on this machine and whether they work (the fa2-probe stage's probe).

``probe(device) -> list[dict]``, one row per kernel family, each with
``name, kind, present, version, works, reason, install`` (+ ``gpu_verified`` for the flash-attn
packages: whether nsa_core's adapter for it ran on a GPU here, ``adapters.GPU_VERIFIED``).
``works`` is None when no call was tried (not installed, not CUDA); True means: a real tiny call
on ``device`` (causal window, fp16, GQA) through nsa_core's adapter for that path ran, was finite
and matched a float64 reference within the fp16 tolerance (FA-2 also through its own
``flash_attn_varlen_func``; FA-4 also the folded compressed-branch call and its ``return_lse``).
A row that is not present says why (not installed -> the install command; import error -> the
symbol and "built for another torch?"; unsupported GPU / dtype / head dim).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import time
from importlib.metadata import PackageNotFoundError

import torch

from nsa_core import _dense
from nsa_core.flash import adapters as _k
from nsa_core.flash.detect import UnreadableDistribution, safe_distribution
from nsa_core.testing import compare
from nsa_core.window import reference as win_ref

INSTALL = {
    "flash_attn (FA-2)": "pip install flash-attn --no-build-isolation  (needs a wheel built for torch "
                         f"{torch.__version__.split('+')[0]} + CUDA {torch.version.cuda or '?'}; a source build "
                         "takes 30-60 min)",
    "flash_attn_interface (FA-3)": "git clone Dao-AILab/flash-attention && cd hopper && python setup.py install "
                                   "(Hopper sm_90 only)",
    "flash_attn.cute (FA-4)": "pip install --pre 'flash-attn-4[cu13]' (CuTe DSL, pre-release; sm_90+; "
                              "offline: bench/prepare_fa4.sh + bench/gpu_fa4_install.sh)",
    "torch varlen_attn": "torch >= 2.10 with CUDA",
}


def _version(dist: str) -> str | None:
    try:
        return safe_distribution(dist).version  # never a blocking read (round 18 B-1)
    except (PackageNotFoundError, UnreadableDistribution, UnicodeError):
        return None


def _tiny(device: str, dtype=torch.float16, D: int = 64):
    g = torch.Generator(device="cpu").manual_seed(1234)
    B, T, HQ, G, w = 2, 80, 4, 2, 24
    q = torch.randn(B, T, HQ, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, T, G, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, G, D, generator=g, dtype=torch.float64)
    ref = win_ref.sliding_attention(q, k, v, w)
    return [x.to(device=device, dtype=dtype) for x in (q, k, v)], ref, w


def _failed(e: Exception) -> str:
    msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"


def _exercise(fn, device: str) -> tuple[bool, str]:
    """Run fn(q, k, v, w, scale) on the tiny case; (works, reason)."""
    (q, k, v), ref, w = _tiny(device)
    t0 = time.perf_counter()
    try:
        out = fn(q, k, v, w, q.shape[-1] ** -0.5)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - every failure is a reported reason
        return False, f"tiny call failed: {_failed(e)}"
    wall = time.perf_counter() - t0
    c = compare(out.float(), ref, torch.float16)
    if not c.ok:
        return False, f"tiny call ran but is wrong: {c}"
    return True, (f"tiny causal-window call (B2 T80 HQ4 G2 d64 fp16) matches the reference: "
                  f"rel_err={c.rel_err:.1e} (first call {wall:.2f} s)")


def _exercise_fa4_extras(device: str) -> tuple[bool, str]:
    """FA-4 beyond the window call: the folded compressed-branch call (bottom-right causal over
    d*h query heads per KV head) and ``return_lse`` (attention_lse) vs float64."""
    from nsa_core.compression import fast as cmp_fast
    from nsa_core.compression import reference as cmp_ref
    from nsa_core.config import NSAConfig

    cfg = NSAConfig()
    g = torch.Generator(device="cpu").manual_seed(4321)
    B, T, HQ, G, D = 1, 300, 4, 2, 64
    q = torch.randn(B, T, HQ, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, T, G, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, G, D, generator=g, dtype=torch.float64)
    kc, vc = cmp_ref.compress_avg(k, cfg), cmp_ref.compress_avg(v, cfg)
    ref = cmp_ref.compressed_attention(q, kc, vc, T, cfg)
    dev = [x.to(device=device, dtype=torch.float16) for x in (q, kc, vc)]
    try:
        out = cmp_fast.compressed_attention(*dev, T, cfg, path="fa4")
        _, lse = _k.attention_lse(dev[0][:, :12], dev[1], dev[2], D ** -0.5, "fa4", causal=True)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        return False, f"compressed-branch / return_lse call failed: {_failed(e)}"
    c = compare(out.float().cpu(), ref, torch.float16)
    qh, kh = dev[0][:, :12].double().cpu(), dev[1].double().cpu()  # 12 rows, 17 compressed keys
    s = torch.einsum("bqhd,bkhd->bhqk", qh, kh.repeat_interleave(HQ // G, 2)) * D ** -0.5
    vis = torch.arange(kh.shape[1])[None, :] <= torch.arange(12)[:, None] + (kh.shape[1] - 12)
    want = torch.logsumexp(s.masked_fill(~vis, float("-inf")), -1).transpose(1, 2)
    lse_err = float((lse.double().cpu() - want).abs().max())
    ok = c.ok and lse_err < 1e-2
    return ok, (f"compressed branch (folded causal, B1 T300 HQ4 G2 d64 fp16): {c}; "
                f"return_lse [B, Lq, H] max |lse - float64| = {lse_err:.1e}" + ("" if ok else " (WRONG)"))


def _import_row(path: str, name: str, module: str, dists: tuple[str, ...], symbols: tuple[str, ...]
                ) -> tuple[dict, object]:
    version = next((v for v in map(_version, dists) if v), None)
    row = {"name": name, "kind": "package", "present": False, "version": version,
           "works": None, "reason": "", "install": INSTALL.get(name, "")}
    d = _k.detect(path)  # the real package (FA-4 installs a bare flash_attn namespace; FA-2 bundles a cute 0.1.0)
    row["version"] = d.get("version") or version
    if d["not_installed"]:
        row["reason"] = f"not installed ({module} {d['reason']}); install: {row['install']}"
        return row, None
    if not d["present"]:
        row["reason"] = f"{module} {d['reason']}"
        return row, None
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001
        row["reason"] = (f"import {module} fails: {type(e).__name__}: {str(e)[:200]} "
                         "(an undefined symbol usually means a wheel built for another torch / CUDA)")
        return row, None
    missing = [s for s in symbols if not hasattr(mod, s)]
    if missing:
        row["reason"] = f"{module} imports but lacks {', '.join(missing)} (version {row['version']})"
        return row, None
    row["present"] = True
    return row, mod


def _fa_varlen_fn(mod):
    def fn(q, k, v, w, scale):
        B, T, H, D = q.shape
        cu = torch.arange(0, (B + 1) * T, T, device=q.device, dtype=torch.int32)
        o = mod.flash_attn_varlen_func(q.reshape(B * T, H, D), k.reshape(B * T, -1, D), v.reshape(B * T, -1, D),
                                       cu, cu, T, T, softmax_scale=scale, causal=True, window_size=(w - 1, 0))
        o = o[0] if isinstance(o, tuple) else o
        return o.reshape(B, T, H, D)
    return fn


def _path_fn(path):
    return lambda q, k, v, w, scale: _k.window(q, k, v, w, scale, path)


def probe(device: str = "cuda") -> list[dict]:
    """One row per kernel family; see the module doc."""
    cuda = device.startswith("cuda") and torch.cuda.is_available()
    rows = []
    if cuda:
        cap = torch.cuda.get_device_capability()
        gpu = f"{torch.cuda.get_device_name()} (sm_{cap[0]}{cap[1]})"
    # flash-attn packages: each exercised through nsa_core's adapter for it (the code that runs)
    for path, name, module, symbols in (
        ("fa2", "flash_attn (FA-2)", "flash_attn", ("flash_attn_varlen_func", "flash_attn_func")),
        ("fa3", "flash_attn_interface (FA-3)", "flash_attn_interface", ("flash_attn_func",)),
        ("fa4", "flash_attn.cute (FA-4)", "flash_attn.cute", ("flash_attn_func",)),
    ):
        row, mod = _import_row(path, name, module, _k.DISTS[path], symbols)
        row["gpu_verified"] = _k.verified_label(path)
        if mod is not None:
            st = _k.status(path, "cuda") if cuda else None
            if not cuda:
                row["reason"] = f"installed, but device {device} is not CUDA"
            elif not st["present"]:
                row["works"], row["reason"] = False, f"on {gpu}: {st['reason']}"
            else:
                checks = [("adapter window", _exercise, (_path_fn(path), device))]
                if path == "fa2":
                    checks.append(("flash_attn_varlen_func", _exercise, (_fa_varlen_fn(mod), device)))
                if path == "fa4":
                    checks.append(("adapter cmp + lse", _exercise_fa4_extras, (device,)))
                reasons = []
                row["works"] = True
                for label, run, args in checks:
                    ok, why = run(*args)
                    row["works"] &= ok
                    reasons.append(f"{label}: {why}")
                row["reason"] = f"on {gpu}: " + "; ".join(reasons)
        rows.append(row)
    # torch-bundled
    row = {"name": "torch varlen_attn", "kind": "torch", "present": False, "version": torch.__version__,
           "works": None, "reason": "", "install": INSTALL["torch varlen_attn"]}
    fn = _k._varlen_fn()
    if fn is None:
        row["reason"] = f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn"
    else:
        row["present"] = True
        row["signature"] = str(inspect.signature(fn))
        if not cuda:
            row["reason"] = f"present; device {device} is not CUDA (flash kernels only)"
        else:
            st = _k.status("varlen", "cuda")
            if not st["present"]:
                row["reason"] = st["reason"]
            else:
                row["works"], why = _exercise(_path_fn("varlen"), device)
                row["reason"] = f"on {gpu}: {why}"
    rows.append(row)
    for path, flag in (("sdpa-flash", "flash_sdp_enabled"), ("sdpa-cudnn", "cudnn_sdp_enabled"),
                       ("sdpa-efficient", "mem_efficient_sdp_enabled")):
        row = {"name": f"SDPA {path[5:]}", "kind": "torch", "present": False, "version": torch.__version__,
               "works": None, "reason": "", "install": "a CUDA build of torch on an sm_80+ GPU"}
        if not cuda:
            row["reason"] = f"device {device} is not CUDA"
        else:
            row["present"] = bool(getattr(torch.backends.cuda, flag)())
            if not row["present"]:
                row["reason"] = f"torch.backends.cuda.{flag}() is False"
            else:
                # sdpa-flash takes no mask: exercise it as plain causal (w >= T)
                if path == "sdpa-flash":
                    fn = lambda q, k, v, w, s: _k.causal(q, k, v, s, "sdpa-flash")  # noqa: E731
                    (q, k, v), _, _ = _tiny(device)
                    ref = _dense.full_attention(*(x.double().cpu() for x in (q, k, v)))
                    try:
                        out = fn(q, k, v, 0, q.shape[-1] ** -0.5)
                        c = compare(out.float().cpu(), ref, torch.float16)
                        row["works"] = c.ok
                        row["reason"] = f"on {gpu}: tiny causal call: {c}"
                    except Exception as e:  # noqa: BLE001
                        row["works"] = False
                        row["reason"] = f"on {gpu}: tiny causal call failed: {type(e).__name__}: {str(e)[:200]}"
                else:
                    row["works"], why = _exercise(_path_fn(path), device)
                    row["reason"] = f"on {gpu}: {why}"
        rows.append(row)
    return rows
