"""Adapters to the attention kernels nsa_core.flash can drive, one per *path*.

Each adapter computes plain attention on the flash-attn layout and exposes only what every
kernel can express without an arbitrary mask:

    causal(q, k, v, scale, path)        q [B, Lq, H, D], k/v [B, Lk, G, D|Dv] -> [B, Lq, H, Dv]
        bottom-right causal: query i sees keys j <= i + Lk - Lq (flash-attn >= 2.1 convention)
    window(q, k, v, w, scale, path)     same layout; query i (position Lk - Lq + i) sees the keys
        max(0, pos - w + 1) .. pos
    attention_lse(q, k, v, scale, path, causal)   (o, lse [B, Lq, H] float32, natural log) on the
        paths in LSE_PATHS (FA-4's ``return_lse``)

Paths (preference order = PATHS): flash-attn 3 (``flash_attn_interface``), flash-attn 2
(``flash_attn``), flash-attn 4 (``flash_attn.cute``, CuTe DSL, JIT-compiled per head dims /
GQA ratio / mask kind / dtype), torch's ``torch.nn.attention.varlen.varlen_attn`` (torch's
bundled FA-2 kernels, with ``window_size``), and SDPA restricted to one backend (flash / cuDNN /
memory-efficient; ``sdpa-math`` is the CPU-capable twin used by tests, never chosen
automatically). GQA: query head ``hq`` uses KV head ``hq // (H // G)`` (group-major), which is
what every flash-attn version does with ``nheads_k < nheads``.

Each flash-attn call is written against that package's real signature (``_fa2``, ``_fa3``,
``_fa4``); ``GPU_VERIFIED`` says which of them ran on a GPU here (docs/benchmarks.md).
"""

from __future__ import annotations

import importlib
import inspect

import torch
import torch.nn.functional as F

from nsa_core.flash import detect as _detect

# name -> (branches it serves, SDPA backend name or None)
PATHS = {
    "fa3": ("cmp", "win"),
    "fa2": ("cmp", "win"),
    "fa4": ("cmp", "win"),
    "varlen": ("cmp", "win"),
    "sdpa-flash": ("cmp",),  # no mask: the sliding band cannot be expressed (only w >= S)
    "sdpa-cudnn": ("cmp", "win"),
    "sdpa-efficient": ("cmp", "win"),
}
TEST_PATHS = ("sdpa-math",)  # CPU twin: the same packing through SDPA's math backend
FLASH_DTYPES = (torch.float16, torch.bfloat16)
SDPA_BACKENDS = {"sdpa-flash": "FLASH_ATTENTION", "sdpa-cudnn": "CUDNN_ATTENTION",
                 "sdpa-efficient": "EFFICIENT_ATTENTION", "sdpa-math": "MATH"}

# the module each flash-attn path calls; whether it is the real package is decided by
# nsa_core.flash.detect (one answer for adapters, routing, fa2-probe and env-pairing)
_MODULES = dict(_detect.MODULES)
# distributions that provide each module (their version is the package version; FA-4's own
# ``flash_attn.cute.__version__`` reads a distribution named "fa4" and says "0.0.0")
DISTS = dict(_detect.DISTS)
detect = _detect.detect
# Whether each flash-attn adapter ran on a GPU here (shown by `nsa-run list fa2-probe`, env.txt
# and fa2_probe.txt). None = not GPU-verified: only CPU tests through a fake module with the
# package's real signature (tests/core/test_flash.py) cover it. Update with the run that did it.
GPU_VERIFIED: dict[str, str | None] = {
    # 2.8.3 built from source on the H100 for sm_90 with head dims 64 / 128 only (bench/gpu_fa2_build.sh;
    # torch 2.11+cu130): fa2-probe 2026-11-25 with it importable, its 28 parity rows PASS
    "fa2": "2.8.3 (source build, sm_90, head dims 64/128) on H100, fa2-probe 2026-11-25: 28 parity rows passed",
    "fa3": None,
    # 4.0.0b36 on an H100 (torch 2.11+cu130): fa2-probe of `nsa-run oneshot --profile full`, run
    # nogit-5c1fb36c6edc, 2026-11-25: its 28 parity rows (cmp + win, fp16 + bf16, fwd + bwd vs float64) PASS
    "fa4": "4.0.0b36 on H100, fa2-probe 2026-11-25: 28 parity rows passed",
}
# paths whose adapter can also return the softmax statistics (attention_lse)
LSE_PATHS = ("fa4",)
_imported: dict[str, object] = {}  # path -> module; "detect:<path>" -> detect.detect(path)


# what exercises each adapter on CPU (tests/_fake_flash.py)
CPU_TESTED = {"fa2": "CPU tests through a fake flash_attn with the 2.8 signature only",
              "fa4": "CPU tests through a fake flash_attn.cute with the 4.0.0b36 signature only",
              "fa3": "no test runs it (no fake of flash_attn_interface either)"}


def verified_label(path: str) -> str:
    """'GPU-verified (<run>)' or 'not GPU-verified (<what tests it on CPU>)'."""
    v = GPU_VERIFIED.get(path)
    return f"GPU-verified ({v})" if v else f"not GPU-verified ({CPU_TESTED.get(path, 'untested')})"


class PathUnavailable(RuntimeError):
    """This kernel path cannot run here (not installed, wrong device/dtype/shape); the message says why."""


# ---------------------------------------------------------------------------------------------
# availability (cheap: import checks and capability, no kernel call)


fa4_jit_cache_dir = _detect.fa4_jit_cache_dir


def _before_import(path: str) -> None:
    _detect.before_import(_MODULES.get(path, ""))  # FA-4's persistent JIT cache (see there)


def _import(path: str):
    if path not in _imported:
        _before_import(path)
        mod = importlib.import_module(_MODULES[path])
        _imported[path] = mod
    return _imported[path]


def _detected(path: str) -> dict:
    """detect.detect(path), once per process (kept in ``_imported``, which tests reset)."""
    key = f"detect:{path}"
    if key not in _imported:
        _before_import(path)
        _imported[key] = _detect.detect(path)
    return _imported[key]


def install_hint(path: str) -> str:
    return {
        "fa2": "pip install flash-attn --no-build-isolation (a wheel built for this torch + CUDA; "
               "never a 45-minute source build on a pod)",
        "fa3": "build hopper/ of Dao-AILab/flash-attention (FA-3, sm_90): cd hopper && python setup.py install",
        "fa4": "pip install --pre 'flash-attn-4[cu13]' (CuTe DSL, sm_90+; offline: bench/prepare_fa4.sh)",
        "varlen": "torch >= 2.10 on CUDA (torch.nn.attention.varlen.varlen_attn)",
    }.get(path, "a CUDA build of torch on an sm_80+ GPU")


def status(path: str, device_type: str) -> dict:
    """{"present": bool, "reason": str, "branches": (...)} for one path on this device type."""
    out = {"present": False, "reason": "", "branches": PATHS.get(path, ("cmp", "win"))}
    if device_type != "cuda" and path not in TEST_PATHS:
        out["reason"] = f"device {device_type}: flash kernels run on CUDA only"
        return out
    if path in _MODULES:
        # the real package, not the module name: FA-4's wheel leaves an empty `flash_attn`
        # namespace (no FA-2), FA-2's wheel bundles an early flash_attn.cute (no FA-4); detect.py
        name = _MODULES[path]
        found = _detected(path)
        if found["not_installed"]:
            out["reason"] = f"{name} {found['reason']} (install: {install_hint(path)})"
            return out
        if not found["present"]:
            out["reason"] = f"{name} {found['reason']}" + (
                "; typically a wheel built for another torch/CUDA" if "import" in found["reason"] else "")
            return out
        try:
            _import(path)
        except Exception as e:  # noqa: BLE001 - an ABI mismatch shows up as any exception type
            out["reason"] = (f"{name} fails to import ({type(e).__name__}: {e}); "
                             "typically a wheel built for another torch/CUDA")
            return out
    elif path == "varlen":
        fn = _varlen_fn()
        if fn is None:
            out["reason"] = f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn"
            return out
        if "window_size" not in inspect.signature(fn).parameters:
            out["reason"] = f"torch {torch.__version__} varlen_attn has no window_size"
            out["branches"] = ("cmp",)
    if device_type == "cuda" and path != "sdpa-math":
        cap = torch.cuda.get_device_capability()
        if cap < (8, 0):
            out["reason"] = f"GPU sm_{cap[0]}{cap[1]} < sm_80: no flash kernels"
            return out
        if path == "fa3" and cap[0] != 9:
            out["reason"] = f"FA-3 needs Hopper (sm_90), this GPU is sm_{cap[0]}{cap[1]}"
            return out
        if path == "fa4" and cap[0] < 9:
            out["reason"] = (f"FA-4's backward needs sm_90+ (its forward also runs on sm_80), "
                             f"this GPU is sm_{cap[0]}{cap[1]}")
            return out
        if path == "sdpa-flash" and not torch.backends.cuda.is_flash_attention_available():
            out["reason"] = "this torch build has no SDPA flash kernel"
            return out
    out["present"] = True
    out["reason"] = out["reason"] or "available"
    return out


def available_paths(device_type: str = "cuda") -> dict:
    """{path: {"present", "reason", "branches"}} in preference order (cheap: no kernel call)."""
    return {p: status(p, device_type) for p in PATHS}


def _varlen_fn():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def check(path: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, branch: str) -> None:
    """Raise PathUnavailable if ``path`` cannot run this call (device, dtype, head dims, branch)."""
    if path not in PATHS and path not in TEST_PATHS:
        raise ValueError(f"unknown flash path {path!r}; expected one of {tuple(PATHS) + TEST_PATHS}")
    if path in PATHS and branch not in PATHS[path]:
        raise PathUnavailable(f"{path} cannot express the {branch} branch")
    st = status(path, q.device.type)
    if not st["present"]:
        raise PathUnavailable(f"{path}: {st['reason']}")
    if branch not in st["branches"]:
        raise PathUnavailable(f"{path}: {st['reason']}")
    if path in ("fa2", "fa3", "fa4", "varlen", "sdpa-flash", "sdpa-cudnn"):
        if q.dtype not in FLASH_DTYPES:
            raise PathUnavailable(f"{path}: dtype {q.dtype} unsupported (fp16/bf16 only)")
        if q.shape[-1] != v.shape[-1] and path in ("fa2", "varlen", "sdpa-flash"):
            raise PathUnavailable(f"{path}: needs dk == dv, got dk={q.shape[-1]} dv={v.shape[-1]}")
        if path == "fa4":
            why = fa4_head_dims_problem(q.shape[-1], v.shape[-1], _capability(q.device))
            if why:
                raise PathUnavailable(f"fa4: {why}")
        elif q.shape[-1] > 256 or q.shape[-1] % 8:
            raise PathUnavailable(f"{path}: head dim {q.shape[-1]} unsupported (multiple of 8, <= 256)")


def _capability(device) -> tuple[int, int] | None:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def fa4_head_dims_problem(dk: int, dv: int, cap: tuple[int, int] | None) -> str:
    """FA-4 4.0's head-dim rule (flash_attn.cute.interface._validate_head_dims), '' when fine.

    sm_90: 8 <= dk, dv <= 256, multiples of 8 (fp16/bf16: 16-byte alignment), dk != dv allowed.
    sm_100/sm_110: both in 8..128, or (192, 128), or (256, 256). sm_120 (SM80 MMA): not
    restricted by FA-4's check; None (no GPU, tests): the sm_90 rule.
    """
    if dk % 8 or dv % 8:
        return f"head dims dk={dk} dv={dv} must be multiples of 8"
    major = cap[0] if cap else 9
    if major in (10, 11):
        if not ((8 <= dk <= 128 and 8 <= dv <= 128) or (dk, dv) in ((192, 128), (256, 256))):
            return f"head dims dk={dk} dv={dv} unsupported on sm_{major}x (8..128, or 192/128, or 256/256)"
    elif major != 12 and not (8 <= dk <= 256 and 8 <= dv <= 256):
        return f"head dims dk={dk} dv={dv} unsupported (8..256 on sm_90)"
    return ""


# ---------------------------------------------------------------------------------------------
# kernels


def _expand_kv(x: torch.Tensor, H: int) -> torch.Tensor:
    """[B, L, G, D] -> [B, L, H, D] (group-major: head hq uses group hq // (H // G))."""
    G = x.shape[2]
    return x if G == H else x.repeat_interleave(H // G, dim=2)


# SDPA backends that take enable_gqa (measured on torch 2.11 / H100: the memory-efficient one
# refuses it, so its KV heads are expanded instead)
_SDPA_GQA = {"sdpa-flash": True, "sdpa-cudnn": True, "sdpa-efficient": False, "sdpa-math": True}


def _sdpa(q, k, v, scale, path, *, is_causal=False, attn_mask=None):
    """q [B, Lq, H, D], k/v [B, Lk, G, D] -> [B, Lq, H, Dv] through one SDPA backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    H, G = q.shape[2], k.shape[2]
    gqa = G != H and _SDPA_GQA[path]
    if G != H and not gqa:
        k, v = _expand_kv(k, H), _expand_kv(v, H)
    kw = {"enable_gqa": True} if gqa else {}
    with sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[path])]):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=attn_mask, is_causal=is_causal, scale=scale, **kw)
    return o.transpose(1, 2)


def _pack(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _cu(B: int, L: int, device) -> torch.Tensor:
    return torch.arange(0, (B + 1) * L, L, device=device, dtype=torch.int32)


def _varlen(q, k, v, scale, window):
    fn = _varlen_fn()
    B, Lq, H = q.shape[:3]
    Lk, G = k.shape[1], k.shape[2]
    params = inspect.signature(fn).parameters
    kw = {"scale": scale} if "scale" in params else {}
    if "enable_gqa" in params and G != H:
        kw["enable_gqa"] = True
    elif G != H:
        k, v = _expand_kv(k, H), _expand_kv(v, H)
    if "window_size" in params:
        kw["window_size"] = window
    elif window == (-1, 0):
        kw["is_causal"] = True
    elif window != (-1, -1):
        raise PathUnavailable("varlen_attn of this torch has no window_size")
    o = fn(_pack(q), _pack(k), _pack(v), _cu(B, Lq, q.device), _cu(B, Lk, q.device), Lq, Lk, **kw)
    if isinstance(o, tuple):
        o = o[0]
    return o.reshape(B, Lq, H, -1)


def _fa2(q, k, v, scale, window):
    """flash-attn 2.x: flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
    return_attn_probs=False) -> out. window (left, right); (-1, -1) = none, (-1, 0) = causal."""
    mod = _import("fa2")
    causal = window == (-1, 0)
    o = mod.flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=scale, causal=causal,
                            window_size=(-1, -1) if causal else window)
    return o[0] if isinstance(o, tuple) else o


def _fa3(q, k, v, scale, window):
    """flash-attn 3 (hopper/flash_attn_interface): flash_attn_func(q, k, v, softmax_scale=None,
    causal=False, ..., window_size=(-1, -1), ...) -> out, or (out, lse) in some versions."""
    mod = _import("fa3")
    causal = window == (-1, 0)
    kw = {"softmax_scale": scale, "causal": causal}
    if not causal and window != (-1, -1):
        kw["window_size"] = window
    o = mod.flash_attn_func(q, k, v, **kw)
    return o[0] if isinstance(o, tuple) else o


def _fa4(q, k, v, scale, window, return_lse=False):
    """flash-attn 4 (flash_attn.cute, 4.0.0b36): flash_attn_func(q, k, v, qv=None,
    gather_kv_indices=None, softmax_scale=None, causal=False, window_size=(None, None),
    learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False,
    score_mod=None, score_mod_bwd=None, mask_mod=None, aux_tensors=None, aux_scalars=None,
    block_sparse_tensors=None, block_sparse_tensors_bwd=None, return_lse=False, ...)
    -> (out [B, Lq, H, Dv], lse [B, H, Lq] float32 natural log, or None without return_lse and
    without grad). Causal / window are bottom-right (seqlen_k - seqlen_q offset), as FA-2.

    Always called with return_lse=True: FA-4 JIT-compiles one kernel per configuration and
    "lse is None" is part of its compile key, so a no-grad call without it would compile a second
    kernel for every shape that training (which allocates lse) already compiled; the lse costs
    B*H*Lq floats next to an output of B*Lq*H*Dv."""
    mod = _import("fa4")
    causal = window == (-1, 0)
    kw = {"softmax_scale": scale, "causal": causal, "return_lse": True}
    if not causal and window != (-1, -1):
        kw["window_size"] = window
    out, lse = mod.flash_attn_func(q, k, v, **kw)
    return (out, lse) if return_lse else out


_FA = {"fa2": _fa2, "fa3": _fa3, "fa4": _fa4}


def attention_lse(q, k, v, scale: float, path: str, causal: bool):
    """(o [B, Lq, H, Dv], lse [B, Lq, H] float32, natural log, detached) in one kernel call.

    ``causal``: bottom-right causal, else every key. Only LSE_PATHS (FA-4's ``return_lse``:
    its lse is [B, H, Lq] fp32 = log sum_j exp(scale * q.k_j), -inf for a row that sees no key).
    """
    if path not in LSE_PATHS:
        raise ValueError(f"attention_lse: path {path!r} returns no lse; expected one of {LSE_PATHS}")
    Lq = q.shape[1]
    window = (-1, 0) if causal and Lq > 1 else (-1, -1)  # one row (decode) sees every key
    o, lse = _fa4(q, k, v, scale, window, return_lse=True)
    return o, lse.detach().float().transpose(1, 2)


def full(q, k, v, scale: float, path: str) -> torch.Tensor:
    """Unmasked attention: every query row sees every key. q [B, Lq, H, D], k/v [B, Lk, G, D]."""
    if path in _FA:
        return _FA[path](q, k, v, scale, (-1, -1))
    if path == "varlen":
        return _varlen(q, k, v, scale, (-1, -1))
    return _sdpa(q, k, v, scale, path)


def causal(q, k, v, scale: float, path: str) -> torch.Tensor:
    """Bottom-right causal attention (see module doc). q [B, Lq, H, D], k/v [B, Lk, G, D]."""
    Lq, Lk = q.shape[1], k.shape[1]
    if Lq == 1:  # the last row sees every key
        return full(q, k, v, scale, path)
    if path in _FA:
        return _FA[path](q, k, v, scale, (-1, 0))
    if path == "varlen":
        return _varlen(q, k, v, scale, (-1, 0))
    # SDPA: is_causal is top-left. Lq == 1 sees every key; Lq == Lk is the same either way;
    # otherwise pad queries at the front to Lk rows (their output is dropped).
    if Lq == Lk:
        return _sdpa(q, k, v, scale, path, is_causal=True)
    if Lq > Lk:
        raise ValueError(f"causal: more query rows ({Lq}) than keys ({Lk})")
    qp = F.pad(q, (0, 0, 0, 0, Lk - Lq, 0))
    return _sdpa(qp, k, v, scale, path, is_causal=True)[:, Lk - Lq:]


def window(q, k, v, w: int, scale: float, path: str, tile: int | None = None) -> torch.Tensor:
    """Sliding-window attention: query i at position Lk - Lq + i sees keys pos-w+1 .. pos."""
    Lk = k.shape[1]
    if w >= Lk:  # the window covers every key: plain causal
        return causal(q, k, v, scale, path)
    if path in _FA:
        return _FA[path](q, k, v, scale, (w - 1, 0))
    if path == "varlen":
        return _varlen(q, k, v, scale, (w - 1, 0))
    if path == "sdpa-flash":
        raise PathUnavailable("sdpa-flash takes no mask: a window shorter than the sequence needs one")
    return _window_tiles(q, k, v, w, scale, path, tile)


def _window_tiles(q, k, v, w, scale, path, tile):
    """Query tiles of c rows, each against its c + w - 1 keys with a band mask (SDPA with a mask).

    Tile n holds query positions a .. a+c-1 (a = p0 + n*c); its keys are positions a-w+1 .. a+c-1
    (front-padded with w-1 zero rows that the mask hides). Row r sees key j iff r <= j <= r+w-1
    and the key position a-w+1+j >= 0. Work per query: c+w-1 keys instead of S.
    """
    B, Lq, H, D = q.shape
    Lk, G = k.shape[1], k.shape[2]
    c = tile or max(16, min(256, w))
    nt = -(-Lq // c)
    p0 = Lk - Lq
    L = c + w - 1
    qp = F.pad(q, (0, 0, 0, 0, 0, nt * c - Lq)).reshape(B * nt, c, H, D)
    back = p0 + nt * c - Lk
    kp = F.pad(k, (0, 0, 0, 0, w - 1, back))[:, p0:]  # index of position p: p - p0 + w - 1 (in kp)
    vp = F.pad(v, (0, 0, 0, 0, w - 1, back))[:, p0:]
    # tiles of L keys with stride c: [B, nt, G, D, L] view -> [B*nt, L, G, D]
    kt = kp.unfold(1, L, c).permute(0, 1, 4, 2, 3).reshape(B * nt, L, G, D)
    vt = vp.unfold(1, L, c).permute(0, 1, 4, 2, 3).reshape(B * nt, L, G, v.shape[-1])
    r = torch.arange(c, device=q.device)
    j = torch.arange(L, device=q.device)
    a = p0 + torch.arange(nt, device=q.device) * c  # first query position per tile
    band = (j[None, :] >= r[:, None]) & (j[None, :] <= r[:, None] + w - 1)  # [c, L]
    real = (a[:, None] - w + 1 + j[None, :]) >= 0  # [nt, L]
    mask = band[None] & real[:, None, :]  # [nt, c, L]
    mask = mask[None].expand(B, nt, c, L).reshape(B * nt, 1, c, L)
    o = _sdpa(qp, kt, vt, scale, path, attn_mask=mask)
    return o.reshape(B, nt * c, H, -1)[:, :Lq]

