"""Selection-attention kernel benchmark (issue: Triton selection kernel), CUDA only.

    python bench/bench_selection.py --what env,table --T-list 8k,16k,32k,64k --out DIR
    python bench/bench_selection.py --what sweep --apply-best --T-list 64k --out DIR

Parts (``--what``, comma-separated, run in the order given):
  env     versions and the GPU
  check   our kernel vs the float64 reference on one paper-scale case (fwd + grads)
  sweep   launch settings of each kernel at the largest T (fwd, dq, dkv, backward modes)
  table   forward and forward+backward at each T: our kernel, fla-core's parallel NSA kernel
          (when installed; given the same block indices), full causal attention through SDPA
          (flash and cuDNN backends); our output and gradients vs fla's (bf16 tolerance);
          bench_selection.csv / .md / .png
  stages  the triton-fwd / triton-bwd stages in-process (profile full) into DIR/stages
  cli     the same two stages through ``nsa-run oneshot --profile full`` (executor, manifest);
          the run folder comes back as DIR/cli_run.tgz

Workload (the issue's): B=1, HQ=64, G=4, head dim 128 (dk = dv), n=16, l'=64, bf16; block
indices = forced (block 0 + the two local blocks) + random distinct causal blocks, per
(token, group), through nsa_core.selection.reference.topn_blocks on random scores. Times are medians of
``nsa_runner.measure.timing.bench`` (p20/p80 kept in the CSV); every kernel is warmed up (fla's
autotuning included) before any timing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

B, HQ, G, D, N_SEL, L_SEL = 1, 64, 4, 128, 16, 64
DTYPE = torch.bfloat16


def log(*a):
    print(*a, flush=True)


def parse_T(text: str) -> list[int]:
    from nsa_runner.stage import int_list

    return int_list(text)


# ---- inputs -----------------------------------------------------------------------------------

def block_indices(T: int, seed: int, device="cuda", n: int = N_SEL, l_sel: int = L_SEL, groups: int = G,
                  batch: int = B):
    """Forced (0, local two) + random distinct causal blocks per (b, t, g): int32 ids, -1 padded."""
    from nsa_core import NSAConfig
    from nsa_core.selection import reference as _blocks

    cfg = NSAConfig(l=32, d=16, l_sel=l_sel, n_sel=n, w=512)
    NB = cfg.num_sel_blocks(T)
    gen = torch.Generator(device=device).manual_seed(seed)
    idx, cnt = [], []
    C = max(1, (1 << 25) // (batch * groups * NB))
    for c0 in range(0, T, C):
        c1 = min(T, c0 + C)
        scores = torch.rand(batch, c1 - c0, groups, NB, generator=gen, device=device, dtype=torch.float32)
        i, c = _blocks.topn_blocks(scores, torch.arange(c0, c1, device=device), cfg)
        idx.append(i)
        cnt.append(c)
    return torch.cat(idx, 1).contiguous(), torch.cat(cnt, 1).contiguous()


def block_indices_fla_style(T: int, seed: int, device="cuda", n: int = N_SEL, l_sel: int = L_SEL):
    """fla's own benchmark indices: per (b, t, g) a random subset of blocks [0, max(1, t // l')) —
    no forced blocks (the current block is never chosen, block 0 only by chance)."""
    NB = (T + l_sel - 1) // l_sel
    gen = torch.Generator(device=device).manual_seed(seed)
    idx, cnt = [], []
    C = max(1, (1 << 25) // (B * G * NB))
    for c0 in range(0, T, C):
        c1 = min(T, c0 + C)
        ncand = torch.clamp(torch.arange(c0, c1, device=device) // l_sel, min=1)  # [C]
        scores = torch.rand(B, c1 - c0, G, NB, generator=gen, device=device)
        j = torch.arange(NB, device=device)
        scores = torch.where(j[None, None, None, :] < ncand[None, :, None, None], scores, -1.0)
        k = min(n, NB)
        top = torch.topk(scores, k, dim=-1).indices
        c = torch.clamp(ncand, max=n).to(torch.int32)[None, :, None].expand(B, c1 - c0, G)
        live = torch.arange(k, device=device) < c[..., None]
        big = torch.iinfo(torch.int64).max
        top = torch.sort(torch.where(live, top, big), dim=-1).values
        top = torch.where(top == big, -1, top)
        if k < n:
            top = torch.cat([top, torch.full((B, c1 - c0, G, n - k), -1, device=device, dtype=top.dtype)], -1)
        idx.append(top.to(torch.int32))
        cnt.append(c.contiguous())
    return torch.cat(idx, 1).contiguous(), torch.cat(cnt, 1).contiguous()


def inputs(T: int, seed: int = 0, dk: int = D, dv: int = D, dtype=DTYPE, style: str = "forced"):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*s):
        return torch.randn(*s, generator=gen, device="cuda", dtype=torch.float32).to(dtype)

    q, k, v = rnd(B, T, HQ, dk), rnd(B, T, G, dk), rnd(B, T, G, dv)
    do = rnd(B, T, HQ, dv)
    if style == "fla":
        idx, cnt = block_indices_fla_style(T, seed + 1)
    else:
        idx, cnt = block_indices(T, seed + 1)
    return q, k, v, idx, cnt, do


# ---- timing -----------------------------------------------------------------------------------

def bench(fn, grad_to_none=None):
    """(median, p20, p80) ms through the shared timer (nsa_runner.measure.timing.bench: CUDA events,
    L2 flushed before each call); ``grad_to_none`` tensors get ``.grad = None`` before each call,
    outside the timing (as ``triton.testing.do_bench`` does). About 200 ms of calls, at least 6."""
    from nsa_runner.measure.timing import bench as _bench

    def reset():
        for x in grad_to_none or ():
            x.grad = None

    t = _bench(fn, device="cuda", warmup_ms=50, rep_ms=200, min_iters=6, max_iters=1000,
               before=reset if grad_to_none else None)
    return t.ms, t.p20, t.p80


def env_info() -> dict:
    import triton

    p = torch.cuda.get_device_properties(0)
    info = {"date": time.strftime("%Y-%m-%d"), "host": platform.node(), "python": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
            "gpu": p.name, "sm_count": p.multi_processor_count, "capability": f"{p.major}.{p.minor}"}
    try:
        import fla

        info["fla"] = getattr(fla, "__version__", "?")
    except Exception as e:  # noqa: BLE001
        info["fla"] = f"not available ({type(e).__name__}: {str(e)[:120]})"
    try:
        import subprocess

        info["git"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                     text=True, timeout=20).stdout.strip()
    except Exception:  # noqa: BLE001
        info["git"] = "?"
    return info


# ---- implementations ----------------------------------------------------------------------------

def ours(q, k, v, idx, cnt, **kw):
    from nsa_core.selection import attention as triton_sel

    return triton_sel.selection_attention(q, k, v, idx, cnt, L_SEL, **kw)


def fla_fn():
    """fla-core's selection kernel (the autograd Function behind parallel_nsa), or None."""
    try:
        from fla.ops.nsa.parallel import ParallelNSAFunction
    except Exception as e:  # noqa: BLE001
        log(f"fla: not available: {type(e).__name__}: {e}")
        return None

    def run(q, k, v, idx, cnt):
        return ParallelNSAFunction.apply(q, k, v, idx, cnt, L_SEL, 1.0 / math.sqrt(q.shape[-1]), None)

    return run


def sdpa_fn(backend_name: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend_name]
    state = {"gqa": True}

    def run(qh, kh, vh):
        with sdpa_kernel([backend]):
            if state["gqa"]:
                try:
                    return torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True,
                                                                            enable_gqa=True)
                except RuntimeError as e:
                    log(f"sdpa-{backend_name}: enable_gqa failed ({str(e)[:100]}); expanding K/V to HQ heads")
                    state["gqa"] = False
            rep = qh.shape[1] // kh.shape[1]
            return torch.nn.functional.scaled_dot_product_attention(
                qh, kh.repeat_interleave(rep, 1), vh.repeat_interleave(rep, 1), is_causal=True)

    return run, state


# ---- parts --------------------------------------------------------------------------------------

def part_check(args, out: Path):
    """Our kernel vs the float64 reference on one paper-scale case (dk=192, dv=128)."""
    from nsa_core.selection import attention as triton_sel
    from nsa_core.testing import compare
    from stages import _parity

    T = args.check_T
    q, k, v, idx, cnt, do = inputs(T, seed=7, dk=192, dv=128)
    t0 = time.time()
    qq, kk, vv = (x.clone().requires_grad_(True) for x in (q, k, v))
    o = triton_sel.selection_attention(qq, kk, vv, idx, cnt, L_SEL, deterministic=True)
    o.backward(do)
    torch.cuda.synchronize()
    t1 = time.time()
    ro, rdq, rdk, rdv = _parity.reference(q, k, v, idx, cnt, L_SEL, do=do)
    t2 = time.time()
    res = {n: str(compare(a, r, DTYPE)) for n, a, r in (("o", o, ro), ("dq", qq.grad, rdq), ("dk", kk.grad, rdk),
                                                         ("dv", vv.grad, rdv))}
    for mode in ("atomic", "index_dq_atomic"):
        g = triton_sel.selection_attention_bwd(q, k, v, o.detach(), _lse(q, k, v, idx, cnt), do, idx, cnt, L_SEL,
                                               dkv_mode=mode)
        for n, a, r in zip(("dq", "dk", "dv"), g, (rdq, rdk, rdv), strict=True):
            res[f"{mode}:{n}"] = str(compare(a, r, DTYPE))
    log(f"check T={T} dk=192 dv=128 bf16: kernel {t1 - t0:.1f} s, float64 reference {t2 - t1:.1f} s")
    for n, s in res.items():
        log(f"  {n:22s} {s}")
    return res


def _lse(q, k, v, idx, cnt):
    from nsa_core.selection import attention as triton_sel

    return triton_sel.selection_attention_fwd(q, k, v, idx, cnt, L_SEL, validate_indices=False)[1]


def _fwd_grid(args):
    grid = [dict(qt=qt, num_warps=w, num_stages=st) for qt in args.sweep_qt for w in args.sweep_warps
            for st in args.sweep_stages]
    return grid + [dict(qt=1, num_warps=2, num_stages=2)]


def _diag(kernel_name):
    from nsa_core.selection import attention as ts

    ck = ts.LAST_COMPILED.get(kernel_name)
    out = {}
    for attr in ("n_regs", "n_spills"):
        out[attr] = getattr(ck, attr, None)
    try:
        out["wgmma"] = "wgmma" in ck.asm["ptx"]
    except Exception:  # noqa: BLE001
        out["wgmma"] = None
    return out


def part_sweep(args, out: Path):
    """Launch settings per kernel at the largest T; returns rows. With --apply-best the fastest
    fwd / dq / dkv settings become nsa_core.selection.attention.CONFIG for the later parts."""
    from nsa_core.selection import attention as ts

    T = max(args.T_list)
    q, k, v, idx, cnt, do = inputs(T, seed=3)
    rows = []

    def rec(kernel, cfg, fn, diag=None):
        try:
            fn()  # compile + warm
            torch.cuda.synchronize()
            med, lo, hi = bench(fn)
            row = {"kernel": kernel, "config": json.dumps(cfg), "T": T, "ms": med, "p20": lo, "p80": hi}
            if diag:
                row.update(_diag(diag))
            rows.append(row)
            log(f"sweep {kernel:10s} {json.dumps(cfg):64s} {med:8.3f} ms  "
                + (f"regs={row.get('n_regs')} spills={row.get('n_spills')} wgmma={row.get('wgmma')}" if diag else ""))
        except Exception as e:  # noqa: BLE001
            rows.append({"kernel": kernel, "config": json.dumps(cfg), "T": T, "ms": float("nan"),
                         "error": f"{type(e).__name__}: {str(e)[:160]}"})
            log(f"sweep {kernel:10s} {json.dumps(cfg):64s} FAILED {type(e).__name__}: {str(e)[:160]}")

    rec("validate", {}, lambda: ts._check_indices(idx, cnt, T, L_SEL))
    for cfg in _fwd_grid(args):
        rec("fwd", cfg, lambda cfg=cfg: ts.selection_attention_fwd(q, k, v, idx, cnt, L_SEL,
                                                                    validate_indices=False, config=cfg), "fwd")
    o, lse = ts.selection_attention_fwd(q, k, v, idx, cnt, L_SEL, validate_indices=False)
    geo = ts._bwd_setup(q, k, v, o, do, idx, L_SEL, None)
    geo["block_size"] = L_SEL
    delta = ts._delta(o, do)
    rec("delta", {}, lambda: ts._delta(o, do))
    for cfg in _fwd_grid(args):
        rec("dq", cfg, lambda cfg=cfg: ts._launch_dq(q, k, v, do, lse, delta, idx, cnt, geo, cfg), "dq")
    for seg in args.sweep_segs:
        rec("index", {"seg": seg}, lambda seg=seg: ts._inverted_index(idx, cnt, geo, seg))
    for seg in args.sweep_segs:
        index = ts._inverted_index(idx, cnt, geo, seg)
        for rws in args.sweep_rows:
            for w in args.sweep_dkv_warps:
                for st in (1, 2):
                    cfg = {"num_warps": w, "num_stages": st, "rows": rws, "seg": seg}
                    rec("dkv", cfg, lambda cfg=cfg, index=index: ts._launch_dkv(q, k, v, do, lse, delta, index, geo,
                                                                                cfg), "dkv")
    import pandas as pd

    df = pd.DataFrame(rows)
    if args.apply_best:
        for kern in ("fwd", "dq", "dkv"):
            d = df[(df.kernel == kern) & df.ms.notna()]
            if len(d):
                best = json.loads(d.loc[d.ms.idxmin(), "config"])
                ts.CONFIG[kern].update(best)
                log(f"apply-best {kern}: {best} ({d.ms.min():.3f} ms)")
    for mode in ts.DKV_MODES:
        rec(f"bwd:{mode}", {}, lambda mode=mode: ts.selection_attention_bwd(q, k, v, o, lse, do, idx, cnt, L_SEL,
                                                                           dkv_mode=mode))
    # bitwise reproducibility of the default (deterministic) backward at this size
    g1 = ts.selection_attention_bwd(q, k, v, o, lse, do, idx, cnt, L_SEL, deterministic=True)
    g2 = ts.selection_attention_bwd(q, k, v, o, lse, do, idx, cnt, L_SEL, deterministic=True)
    same = all(torch.equal(a, b) for a, b in zip(g1, g2, strict=True))
    log(f"deterministic backward bitwise identical across 2 runs at T={T}: {same}")
    ga = ts.selection_attention_bwd(q, k, v, o, lse, do, idx, cnt, L_SEL, dkv_mode="atomic")
    gb = ts.selection_attention_bwd(q, k, v, o, lse, do, idx, cnt, L_SEL, dkv_mode="atomic")
    log("atomic backward bitwise identical across 2 runs: "
        f"{[bool(torch.equal(a, b)) for a, b in zip(ga, gb, strict=True)]} (dq, dk, dv)")
    df = pd.DataFrame(rows)
    df.to_csv(out / "sweep.csv", index=False)
    log(f"CONFIG now {json.dumps(ts.CONFIG)}")
    return df


def part_table(args, out: Path):
    import pandas as pd

    fla = None if args.no_fla else fla_fn()
    flash, flash_state = sdpa_fn("flash")
    cudnn, cudnn_state = sdpa_fn("cudnn")
    rows, agree = [], []
    state = {"fla": fla}
    for T in sorted(args.T_list, reverse=True):  # largest first: fla autotunes at the target size
        _table_T(T, args, state, flash, cudnn, rows, agree)
        torch.cuda.empty_cache()
    if args.fla_style_T:
        for T in args.fla_style_T:  # fla's own benchmark indices, as a second workload
            _table_T(T, args, state, flash, cudnn, rows, agree, style="fla")
            torch.cuda.empty_cache()
    df = pd.DataFrame(rows)
    df.to_csv(out / "bench_selection.csv", index=False)
    (out / "agreement.json").write_text(json.dumps(agree, indent=2))
    md = _markdown(df[df["indices"] == "forced"], flash_state, cudnn_state)
    if (df["indices"] == "fla").any():
        md += "\nfla-style indices (random subset of blocks < t // l', no forced blocks):\n\n"
        md += _markdown(df[df["indices"] == "fla"], flash_state, cudnn_state).rsplit("SDPA GQA", 1)[0]
    (out / "bench_selection.md").write_text(md)
    log(md)
    _plot(df, out / "bench_selection.png")
    return df


def _table_T(T, args, state, flash, cudnn, rows, agree, style="forced"):
    """One sequence length of the table: agreement with fla, then the timings."""
    from nsa_core.testing import compare

    fla = state["fla"]
    q, k, v, idx, cnt, do = inputs(T, seed=11, style=style)
    qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
    impls = {"ours": lambda: ours(q, k, v, idx, cnt)}
    fwdbwd = {"ours": lambda: ours(qg, kg, vg, idx, cnt).backward(do)}
    for mode in args.modes:
        fwdbwd[f"ours[{mode}]"] = (lambda mode=mode: ours(qg, kg, vg, idx, cnt, dkv_mode=mode).backward(do))
    if fla is not None:
        impls["fla"] = lambda: fla(q, k, v, idx, cnt)
        fwdbwd["fla"] = lambda: fla(qg, kg, vg, idx, cnt).backward(do)
    qh, kh, vh = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    doh = do.transpose(1, 2).contiguous()
    qhg, khg, vhg = (x.clone().requires_grad_(True) for x in (qh, kh, vh))
    for name, fn in (("sdpa-flash", flash), ("sdpa-cudnn", cudnn)):
        if T <= args.sdpa_max_T and style == "forced":
            impls[name] = (lambda fn=fn: fn(qh, kh, vh))
            fwdbwd[name] = (lambda fn=fn: fn(qhg, khg, vhg).backward(doh))

    # agreement first (a speedup is never reported on a red gate)
    with torch.no_grad():
        o_ours = ours(q, k, v, idx, cnt)
    if fla is not None:
        try:
            with torch.no_grad():
                o_fla = fla(q, k, v, idx, cnt)
            c = compare(o_ours, o_fla, DTYPE)
            qa, ka, va = (x.clone().requires_grad_(True) for x in (q, k, v))
            ours(qa, ka, va, idx, cnt).backward(do)
            qb, kb, vb = (x.clone().requires_grad_(True) for x in (q, k, v))
            fla(qb, kb, vb, idx, cnt).backward(do)
            cg = {n: compare(a.grad, b.grad, DTYPE) for n, a, b in (("dq", qa, qb), ("dk", ka, kb),
                                                                      ("dv", va, vb))}
            agree.append({"T": T, "o": str(c), **{n: str(x) for n, x in cg.items()},
                          "ok": c.ok and all(x.ok for x in cg.values())})
            log(f"T={T} ours vs fla: o {c}; " + "; ".join(f"{n} {x}" for n, x in cg.items()))
            del qa, ka, va, qb, kb, vb
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            log(f"fla failed at T={T}: {type(e).__name__}: {e}; benchmarking without it")
            impls.pop("fla", None)
            fwdbwd.pop("fla", None)
            agree.append({"T": T, "o": f"fla failed: {type(e).__name__}: {str(e)[:200]}", "ok": False})
            fla = None
    for label, table, gnone in (("fwd", impls, None), ("fwd+bwd", fwdbwd, "grad")):
        for name, fn in table.items():
            gtn = None
            if gnone:
                gtn = [qhg, khg, vhg] if name.startswith("sdpa") else [qg, kg, vg]
            try:
                ctx = torch.no_grad() if label == "fwd" else _null()
                with ctx:
                    med, lo, hi = bench(fn, grad_to_none=gtn)
                rows.append({"T": T, "indices": style, "pass": label, "impl": name, "ms": med, "p20": lo, "p80": hi})
                log(f"T={T:6d} {style:6s} {label:8s} {name:22s} {med:9.3f} ms  (p20 {lo:.3f}, p80 {hi:.3f})")
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                rows.append({"T": T, "indices": style, "pass": label, "impl": name, "ms": float("nan"),
                             "error": f"{type(e).__name__}: {str(e)[:200]}"})
                log(f"T={T:6d} {label:8s} {name:22s} FAILED {type(e).__name__}: {str(e)[:200]}")
    torch.cuda.empty_cache()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _markdown(df, flash_state, cudnn_state) -> str:
    lines = []
    for label in ("fwd", "fwd+bwd"):
        d = df[df["pass"] == label].pivot_table(index="T", columns="impl", values="ms")
        cols = list(d.columns)
        head = "| T | " + " | ".join(f"{c} ms" for c in cols)
        if "fla" in cols:
            head += " | ours / fla"
        if "sdpa-flash" in cols:
            head += " | ours / sdpa-flash"
        lines.append(f"**{label}** (median ms, nsa_runner.measure.timing)\n")
        lines.append(head + " |")
        lines.append("|" + "---|" * (head.count("|")))
        for T, r in d.iterrows():
            cells = [f"{r[c]:.2f}" if not math.isnan(r[c]) else "-" for c in cols]
            if "fla" in cols:
                cells.append(f"{r['ours'] / r['fla']:.2f}x")
            if "sdpa-flash" in cols:
                cells.append(f"{r['ours'] / r['sdpa-flash']:.3f}x" if not math.isnan(r["sdpa-flash"]) else "-")
            lines.append(f"| {T // 1024}K | " + " | ".join(cells) + " |")
        lines.append("")
    lines.append(f"SDPA GQA: flash {'native enable_gqa' if flash_state['gqa'] else 'K/V expanded to HQ heads'}, "
                 f"cudnn {'native enable_gqa' if cudnn_state['gqa'] else 'K/V expanded to HQ heads'}")
    return "\n".join(lines) + "\n"


def _plot(df, path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=False)
    for ax, label in zip(axes, ("fwd", "fwd+bwd"), strict=True):
        d = df[(df["pass"] == label) & (df["indices"] == "forced")].dropna(subset=["ms"])
        for impl, g in d.groupby("impl"):
            g = g.sort_values("T")
            ax.plot(g["T"], g["ms"], marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("T (tokens)")
        ax.set_ylabel("ms (median)")
        ax.set_title(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("selection attention, B=1 HQ=64 G=4 d=128 n=16 l'=64 bf16 (median ms, log scale)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def part_stages(args, out: Path):
    from types import SimpleNamespace

    from stages.triton_bwd import TritonBwd
    from stages.triton_fwd import TritonFwd

    d = out / "stages"
    d.mkdir(exist_ok=True)
    res = {}
    for S in (TritonFwd, TritonBwd):
        t0 = time.time()
        r = S().run(SimpleNamespace(dir=d, device="cuda", profile="full", options={"cases": args.stage_cases},
                                    run_id="bench", stage=S.name))
        res[S.name] = r.to_dict()
        log(f"stage {S.name}: {r.status.value} ({time.time() - t0:.0f} s) {r.reason}")
        log((d / f"triton_{S.name.split('-')[1]}.txt").read_text())
    return res


def part_cli(args, out: Path):
    """`nsa-run oneshot --profile full --only triton-fwd,triton-bwd` through the real CLI + executor.

    Where the checkout is not pip-installed (the GPU machine), the entry points are made visible
    the way pip would: a dist-info folder (METADATA + entry_points.txt from pyproject.toml) on
    PYTHONPATH. The run folder is tarred into OUT (cli_run.tgz); the stage .txt files are printed.
    """
    import subprocess
    import tarfile
    import tempfile

    import tomllib

    env = dict(os.environ)
    try:
        import importlib.metadata as md

        md.distribution("nsa-run")
    except Exception:  # noqa: BLE001 - not installed: register the entry points by hand
        site = Path(tempfile.mkdtemp(prefix="nsa_ep_"))
        meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
        info = site / "nsa_run-0.1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nsa-run\nVersion: 0.1.0\n")
        eps = meta["project"]["entry-points"]["nsa_runner.stages"]
        lines = "".join(f"{k} = {v}\n" for k, v in eps.items())
        (info / "entry_points.txt").write_text("[nsa_runner.stages]\n" + lines)
        env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), env.get("PYTHONPATH", "")])
        log(f"registered entry points from pyproject.toml in {info}")
    runs = Path(tempfile.mkdtemp(prefix="nsa_runs_"))
    cmd = [sys.executable, "-m", "nsa_runner.cli", "oneshot", "--profile", "full", "--only", "triton-fwd,triton-bwd",
           "--out", str(runs)]
    log("$ nsa-run " + " ".join(cmd[3:]))
    r = subprocess.run(cmd, env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=args.cli_timeout)
    log(r.stdout[-6000:])
    log(r.stderr[-3000:])
    log(f"nsa-run exit code {r.returncode}")
    for txt in sorted(runs.rglob("triton_*.txt")):
        log(f"---- {txt.relative_to(runs)}\n{txt.read_text()}")
    with tarfile.open(out / "cli_run.tgz", "w:gz") as tf:
        tf.add(runs, arcname="runs")
    return {"exit_code": r.returncode}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--what", default="env,table")
    ap.add_argument("--T-list", default="8k,16k,32k,64k", type=parse_T)
    ap.add_argument("--out", default=str(ROOT / "artifacts" / "bench"))
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--modes", default="", help="extra backward modes to time in the table (comma list)")
    ap.add_argument("--sdpa-max-T", type=int, default=1 << 20)
    ap.add_argument("--check-T", type=int, default=2048)
    ap.add_argument("--sweep-warps", default="4,8", type=parse_T)
    ap.add_argument("--sweep-stages", default="2,3", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--sweep-qt", default="1,2,4", type=parse_T)
    ap.add_argument("--sweep-rows", default="32,64", type=parse_T)
    ap.add_argument("--sweep-dkv-warps", default="2,4", type=parse_T)
    ap.add_argument("--sweep-segs", default="1024,4096", type=parse_T)
    ap.add_argument("--apply-best", action="store_true", help="sweep: make the fastest settings the CONFIG")
    ap.add_argument("--fla-style-T", default="", type=lambda s: parse_T(s) if s else [],
                    help="table: also these T with fla's own benchmark indices")
    ap.add_argument("--stage-cases", default=None)
    ap.add_argument("--cli-timeout", type=int, default=420)
    ap.add_argument("--config", default=None, help="JSON overrides of nsa_core.selection.attention.CONFIG")
    args = ap.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    if not torch.cuda.is_available():
        print("bench_selection: needs a CUDA GPU (timings on the Triton interpreter mean nothing)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.config:
        from nsa_core.selection import attention as triton_sel

        for key, val in json.loads(args.config).items():
            if key == "DEFAULT_DKV_MODE":
                triton_sel.DEFAULT_DKV_MODE = val
            else:
                triton_sel.CONFIG[key].update(val)
    from nsa_core.selection import attention as triton_sel

    log(f"CONFIG {json.dumps(triton_sel.CONFIG)} DEFAULT_DKV_MODE={triton_sel.DEFAULT_DKV_MODE}")
    results = {"argv": sys.argv, "config": triton_sel.CONFIG}
    for part in [p.strip() for p in args.what.split(",") if p.strip()]:
        t0 = time.time()
        try:
            if part == "env":
                results["env"] = env_info()
                log(json.dumps(results["env"], indent=1))
            elif part == "check":
                results["check"] = part_check(args, out)
            elif part == "sweep":
                part_sweep(args, out)
            elif part == "table":
                part_table(args, out)
            elif part == "stages":
                results["stages"] = part_stages(args, out)
            elif part == "cli":
                results["cli"] = part_cli(args, out)
            else:
                print(f"unknown part {part!r}", file=sys.stderr)
                return 2
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            log(f"part {part} FAILED: {type(e).__name__}: {e}")
            results[f"{part}_error"] = f"{type(e).__name__}: {e}"
        log(f"== part {part} took {time.time() - t0:.0f} s")
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
