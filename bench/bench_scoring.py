"""Fused selection scoring + top-n (nsa_core.selection.scoring) and the whole NSA prefill, CUDA.

    PYTHONPATH=. python bench/bench_scoring.py --what env,check,sweep,table --T-list 8k,16k,32k,64k --out DIR

Parts (``--what``, comma-separated, run in the order given):
  env     versions and the GPU
  check   the fused choice vs the reference choice (bf16 paper shapes at --check-T, fp32 at a
          quarter of it): rows equal, every differing row a near-tie of the float64 scores
  sweep   score-kernel launch settings at the largest T (BM, BC, warps, stages) and top-n rows
  table   per T: selection alone (fused kernel; fused + compress; the torch reference path),
          full causal attention (SDPA flash, cuDNN) fwd and fwd+bwd, the whole
          ``functional.nsa_attention`` fwd and fwd+bwd (fast backends, and "auto") with its
          parts (compress, select, cmp, slc, win, gate combine); scoring.csv + a printed table

Workload (issue 11): B=1, HQ=64, G=4, dk=dv=128, l=32, d=16, l'=64, n=16, w=512, bf16.
Timer: nsa_runner.measure.timing.bench (median / p20 / p80 of CUDA events, L2 flushed).
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

B, HQ, G, D = 1, 64, 4, 128
FAST = {"cmp": "flash", "slc": "triton", "win": "flash", "score": "triton"}
DEV = "cuda"  # --dry-run: "cpu" (TRITON_INTERPRET=1, tiny T, sdpa instead of flash): checks this script only


def log(*a):
    print(*a, flush=True)


def parse_T(text: str) -> list[int]:
    out = []
    for x in text.split(","):
        x = x.strip().lower()
        out.append(int(float(x[:-1]) * 1024) if x.endswith("k") else int(x))
    return out


def cfg_default():
    from nsa_core import NSAConfig

    return NSAConfig(l=32, d=16, l_sel=64, n_sel=16, w=512)


def inputs(T, seed=0, dtype=torch.bfloat16, grad=False):
    g = torch.Generator(device=DEV).manual_seed(seed)

    def r(*s):
        x = torch.randn(*s, generator=g, device=DEV, dtype=torch.float32).to(dtype)
        return x.requires_grad_(grad)

    q = r(B, T, HQ, D)
    kv = [r(B, T, G, D) for _ in range(6)]
    gates = torch.rand(B, T, HQ, 3, generator=g, device=DEV).to(dtype).requires_grad_(grad)
    return q, kv, gates


def timer(fn, **kw):
    from nsa_runner.measure.timing import bench

    kw.setdefault("rep_ms", 150.0)
    kw.setdefault("min_iters", 3)
    return bench(fn, device=DEV, **kw)


# ---- parts ----------------------------------------------------------------------------------

def part_env(args, out):
    import triton

    info = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "python": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
            "gpu": torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu (dry run)",
            "capability": list(torch.cuda.get_device_capability(0)) if DEV == "cuda" else None,
            "cudnn": torch.backends.cudnn.version()}
    log(json.dumps(info))
    (out / "env.json").write_text(json.dumps(info, indent=1))


def _near_tie_check(idx, cnt, ridx, rcnt, s64, cfg, T, rel_tol):
    """-> (rows, differing, worst relative gap); AssertionError on a non-near-tie difference."""
    assert torch.equal(cnt, rcnt), "block_count differs"
    diff = (idx != ridx).any(-1)
    n_diff = int(diff.sum())
    worst = 0.0
    for b, t, g in diff.nonzero().tolist()[:2000]:
        got = set(idx[b, t, g].tolist()) - {-1}
        ref = set(ridx[b, t, g].tolist()) - {-1}
        cur = t // cfg.l_sel
        forced = {0, cur} | ({cur - 1} if cur >= 1 else set())
        assert forced <= got, (b, t, g, "forced block missing", sorted(got))
        s = s64[b, t, g]
        a = float(sum(s[j] for j in ref - got))
        c = float(sum(s[j] for j in got - ref))
        rel = abs(a - c) / max(abs(a), 1e-300)
        worst = max(worst, rel)
        assert rel < rel_tol, (b, t, g, sorted(got), sorted(ref), rel)
    return diff.numel(), n_diff, worst


def part_check(args, out):
    from nsa_core import functional as F
    from nsa_core.selection import scoring

    cfg = cfg_default()
    rows = []
    log(f"check with scoring.CONFIG = {scoring.CONFIG}")
    low = (torch.bfloat16, 1e-2) if DEV == "cuda" else (torch.float16, 2e-3)  # interpreter: no bf16 loads
    for T, dtype, tol in ((args.check_T, *low), (max(1024, args.check_T // 4), torch.float32, 1e-5)):
        q, kv, _ = inputs(T, seed=3, dtype=dtype)
        kc = F.compress(kv[0], cfg)
        idx, cnt = scoring.fused_select_blocks(q, kc, T, cfg)
        ridx, rcnt = F.select_blocks(q, kv[0], cfg, backend="reference")
        s64 = F.block_scores(q.double(), kc.double(), T, cfg)
        # the oracle's own choice on the float64 scores
        from nsa_core.selection.reference import topn_blocks

        oidx, ocnt = topn_blocks(s64, torch.arange(T, device=DEV), cfg)
        n, nd, worst = _near_tie_check(idx.cpu(), cnt.cpu(), oidx.cpu(), ocnt.cpu(), s64.cpu(), cfg, T, tol)
        _, nd_t, _ = _near_tie_check(ridx.cpu(), rcnt.cpu(), oidx.cpu(), ocnt.cpu(), s64.cpu(), cfg, T, tol)
        row = {"T": T, "dtype": str(dtype).replace("torch.", ""), "rows": n, "fused_vs_f64_diff": nd,
               "fused_equal_frac": 1 - nd / n, "torch_fp32_vs_f64_diff": nd_t, "worst_rel_gap": worst, "tol": tol}
        log("check", row)
        assert nd / n <= 1e-3, row
        rows.append(row)
    (out / "check.json").write_text(json.dumps(rows, indent=1))


def part_sweep(args, out):
    from nsa_core import functional as F
    from nsa_core.selection import scoring

    cfg = cfg_default()
    T = max(args.T_list)
    q, kv, _ = inputs(T)
    kc = F.compress(kv[0], cfg)
    ref = scoring.fused_select_blocks(q, kc, T, cfg)
    res = []
    combos = [{"score": dict(scoring.CONFIG["score"])}]
    for BM, BC, nw, ns in ((256, 64, 4, 3), (256, 32, 4, 2), (256, 64, 8, 2), (512, 64, 8, 2), (512, 64, 8, 3),
                           (512, 32, 8, 2), (128, 64, 4, 2), (256, 128, 8, 2)):
        combos.append({"score": {"BM": BM, "BC": BC, "num_warps": nw, "num_stages": ns}})
    for re, nw in ((1024, 1), (2048, 1), (4096, 1), (1024, 2), (2048, 2), (4096, 2), (2048, 4), (8192, 4)):
        combos.append({"topn": {"rows_elems": re, "num_warps": nw}})
    for c in combos:
        try:
            got = scoring.fused_select_blocks(q, kc, T, cfg, config=c)
            n_diff = int((got[0] != ref[0]).any(-1).sum())  # rows whose choice differs from the default config
            same = n_diff == 0
            t = timer(lambda c=c: scoring.fused_select_blocks(q, kc, T, cfg, config=c), rep_ms=60)
            res.append({"config": json.dumps(c), "ms": t.ms, "p20": t.p20, "p80": t.p80, "same": same,
                        "rows_diff": n_diff})
            log(f"sweep {c}: {t.ms:.3f} ms rows differing from the default config: {n_diff}")
        except Exception as e:  # noqa: BLE001
            log(f"sweep {c}: FAILED {type(e).__name__}: {str(e)[:200]}")
            res.append({"config": json.dumps(c), "ms": float("nan"), "p20": float("nan"), "p80": float("nan"),
                        "same": False, "rows_diff": -1})
    with open(out / "sweep.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(res[0]))
        w.writeheader()
        w.writerows(res)
    base = {"score": dict(scoring.CONFIG["score"]), "topn": dict(scoring.CONFIG["topn"])}
    for kind in ("score", "topn"):
        ok = [r for r in res if 0 <= r["rows_diff"] <= 1e-3 * ref[0][..., 0].numel() and r["ms"] == r["ms"]
              and kind in json.loads(r["config"])]
        if ok:
            best = min(ok, key=lambda r: r["ms"])
            log(f"sweep best {kind}: {best}")
            if args.apply_best:
                scoring.CONFIG[kind] = {**base[kind], **json.loads(best["config"])[kind]}
    log(f"scoring.CONFIG now {scoring.CONFIG}")


def _sdpa(backend_name):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend_name]

    def run(qh, kh, vh):
        with sdpa_kernel([be]):
            return torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True)

    return run


def _table_T(T, args, cfg, add):
    from nsa_core import _gates
    from nsa_core import functional as F
    from nsa_core.selection import scoring

    q, kv, gates = inputs(T, grad=True)
    kcm, vcm, ks, vs, kw, vw = kv
    qd = q.detach()
    kc = F.compress(kcm.detach(), cfg)
    vc = F.compress(vcm.detach(), cfg)
    # selection alone
    add(T, "sel_fused_kernel", timer(lambda: scoring.fused_select_blocks(qd, kc, T, cfg)))
    # the same with the compressed branch's lse given (pass 1 skipped), and that branch with/without lse
    from nsa_core.compression import fast as cmp_fast

    cpath = None if DEV == "cuda" else "sdpa-math"  # --dry-run: the CPU twin
    _, lse = cmp_fast.compressed_attention(qd, kc, vc, T, cfg, path=cpath, return_lse=True)
    if lse is not None:
        add(T, "sel_fused_kernel_given_lse", timer(lambda: scoring.fused_select_blocks(qd, kc, T, cfg, lse=lse)))
        add(T, "cmp_fwd_with_lse",
            timer(lambda: cmp_fast.compressed_attention(qd, kc, vc, T, cfg, path=cpath, return_lse=True)))
        add(T, "cmp_fwd_public", timer(lambda: cmp_fast.compressed_attention(qd, kc, vc, T, cfg, path=cpath)))
    else:
        log(f"T={T}: the routed cmp path returns no lse")
    add(T, "sel_fused+compress", timer(lambda: F.select_blocks(qd, kcm.detach(), cfg, backend="triton")))
    # the top-n kernel alone on a compact score tensor, and torch.topk on it (not tie-exact; speed reference)
    NB = cfg.num_sel_blocks(T)
    sc = torch.rand(B, T, G, NB, device=DEV)
    ti = torch.empty(B, T, G, cfg.n_sel, dtype=torch.int32, device=DEV)
    tc = torch.empty(B, T, G, dtype=torch.int32, device=DEV)
    add(T, "sel_topn_kernel_only", timer(lambda: scoring._launch_topn(
        sc, ti, tc, B, T, G, 0, T, T, cfg.num_cmp(T), NB, cfg, scoring.CONFIG["topn"], False)))
    add(T, "sel_torch_topk_only", timer(lambda: torch.topk(sc, min(cfg.n_sel, NB), dim=-1)))
    if T <= args.torch_sel_max_T:
        add(T, "sel_torch_reference", timer(lambda: F.select_blocks(qd, kcm.detach(), cfg, backend="reference"),
                                            rep_ms=50, min_iters=2))
    # full attention
    qh = q.detach().transpose(1, 2)
    kh, vh = ks.detach().transpose(1, 2), vs.detach().transpose(1, 2)
    for name in ("flash", "cudnn"):
        try:
            f = _sdpa(name)
            add(T, f"full_sdpa_{name}_fwd", timer(lambda f=f: f(qh, kh, vh)))
            qg, kg, vg = (x.clone().requires_grad_(True) for x in (qh, kh, vh))
            do = torch.randn_like(qh)

            def fb(f=f, qg=qg, kg=kg, vg=vg, do=do):
                o = f(qg, kg, vg)
                o.backward(do)
            add(T, f"full_sdpa_{name}_fwdbwd", timer(fb))
        except Exception as e:  # noqa: BLE001
            log(f"full sdpa {name}: {type(e).__name__}: {str(e)[:200]}")
    # whole NSA
    args_nsa = (q, kcm, vcm, ks, vs, kw, vw, gates, cfg)
    with torch.no_grad():
        add(T, "nsa_fwd_fast", timer(lambda: F.nsa_attention(*args_nsa, FAST)))
        add(T, "nsa_fwd_auto", timer(lambda: F.nsa_attention(*args_nsa, "auto")))
        saved, cmp_fast.LSE_PATHS = cmp_fast.LSE_PATHS, ()  # the two-pass scoring (no lse), same run
        try:
            add(T, "nsa_fwd_fast_no_lse", timer(lambda: F.nsa_attention(*args_nsa, FAST)))
        finally:
            cmp_fast.LSE_PATHS = saved
    do = torch.randn(B, T, HQ, D, device=DEV, dtype=q.dtype)

    def nsa_fb():
        o = F.nsa_attention(*args_nsa, FAST)
        o.backward(do)
        q.grad = None
        gates.grad = None
        for x in kv:
            x.grad = None
    add(T, "nsa_fwdbwd_fast", timer(nsa_fb))
    # parts (forward), same calls as nsa_attention makes
    with torch.no_grad():
        idx, cnt = scoring.fused_select_blocks(qd, kc, T, cfg)
        add(T, "part_compress_kv", timer(lambda: (F.compress(kcm, cfg), F.compress(vcm, cfg))))
        add(T, "part_cmp_fwd", timer(lambda: F._compressed_on(qd, kc, vc, T, cfg, FAST["cmp"], None)))
        add(T, "part_slc_fwd", timer(lambda: F.selection_attention(qd, ks, vs, idx, cnt, cfg, FAST["slc"])))
        add(T, "part_win_fwd", timer(lambda: F.sliding_attention(qd, kw, vw, cfg, FAST["win"])))
        g = gates.detach()
        o3 = [torch.randn(B, T, HQ, D, device=DEV, dtype=q.dtype) for _ in range(3)]
        add(T, "part_combine_fwd_torch", timer(lambda: _gates._torch(g, *o3)))
        add(T, "part_combine_fwd_fused", timer(lambda: _gates.combine(g, *o3)))
    g3 = [gates.detach().clone().requires_grad_(True)] + [x.requires_grad_(True) for x in o3]

    def comb_fb(fn):
        fn(*g3).backward(do)
        for x in g3:
            x.grad = None
    add(T, "part_combine_fwdbwd_torch", timer(lambda: comb_fb(_gates._torch)))
    add(T, "part_combine_fwdbwd_fused", timer(lambda: comb_fb(_gates.combine)))
    # parts (forward + backward)
    qg = q.detach().clone().requires_grad_(True)
    kcg, vcg, ksg, vsg, kwg, vwg = (x.detach().clone().requires_grad_(True) for x in kv)

    def _none(*xs):  # fresh gradients each call (no accumulation kernels in the timing)
        for x in xs:
            x.grad = None

    def cmp_fb():
        o = F._compressed_on(qg, F.compress(kcg, cfg), F.compress(vcg, cfg), T, cfg, FAST["cmp"], None)
        o.backward(do)
        _none(qg, kcg, vcg)

    def slc_fb():
        o = F.selection_attention(qg, ksg, vsg, idx, cnt, cfg, FAST["slc"])
        o.backward(do)
        _none(qg, ksg, vsg)

    def win_fb():
        o = F.sliding_attention(qg, kwg, vwg, cfg, FAST["win"])
        o.backward(do)
        _none(qg, kwg, vwg)
    add(T, "part_cmp_fwdbwd(+compress)", timer(cmp_fb))
    add(T, "part_slc_fwdbwd", timer(slc_fb))
    add(T, "part_win_fwdbwd", timer(win_fb))


def part_table(args, out):
    cfg = cfg_default()
    rows = []

    def add(T, what, t, note=""):
        rows.append({"T": T, "what": what, "ms": round(t.ms, 4), "p20": round(t.p20, 4), "p80": round(t.p80, 4),
                     "n": t.n, "note": note})
        log(f"T={T:6d} {what:28s} {t.ms:9.3f} ms  (p20 {t.p20:.3f}, p80 {t.p80:.3f}) {note}")

    for T in sorted(args.T_list, reverse=True):  # the largest first: it matters most
        try:
            _table_T(T, args, cfg, add)
            if DEV == "cuda":
                torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001
            log(f"T={T}: FAILED {type(e).__name__}: {e}")
            traceback.print_exc()
            torch.cuda.empty_cache()
    with open(out / "scoring.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["T", "what", "ms", "p20", "p80", "n", "note"])
        w.writeheader()
        w.writerows(rows)
    # short table last
    Ts = sorted({r["T"] for r in rows})
    whats = list(dict.fromkeys(r["what"] for r in rows))
    ms = {(r["T"], r["what"]): r["ms"] for r in rows}
    log("\n| what | " + " | ".join(f"{T // 1024}K" for T in Ts) + " |")
    log("|---|" + "---|" * len(Ts))
    for wname in whats:
        log(f"| {wname} | " + " | ".join(f"{ms.get((T, wname), float('nan')):.2f}" for T in Ts) + " |")
    for T in Ts:
        f_fwd = ms.get((T, "full_sdpa_flash_fwd"))
        f_fb = ms.get((T, "full_sdpa_flash_fwdbwd"))
        n_fwd = ms.get((T, "nsa_fwd_fast"))
        n_fb = ms.get((T, "nsa_fwdbwd_fast"))
        if f_fwd and n_fwd and f_fb and n_fb:
            log(f"T={T}: NSA fwd {f_fwd / n_fwd:.2f}x faster than SDPA-flash; fwd+bwd {f_fb / n_fb:.2f}x")


def part_profile(args, out):
    """torch.profiler over one whole-NSA forward+backward at the largest T: time per kernel (top 30)."""
    from torch.profiler import ProfilerActivity, profile

    from nsa_core import functional as F

    cfg = cfg_default()
    T = max(args.T_list)
    q, kv, gates = inputs(T, grad=True)
    do = torch.randn(B, T, HQ, D, device=DEV, dtype=q.dtype)
    for _ in range(2):  # warm (compile, autotune)
        F.nsa_attention(q, *kv, gates, cfg, FAST).backward(do)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        F.nsa_attention(q, *kv, gates, cfg, FAST).backward(do)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70)
    (out / "profile.txt").write_text(table)
    log(table)


PARTS = {"env": part_env, "check": part_check, "sweep": part_sweep, "table": part_table, "profile": part_profile}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--what", default="env,check,table")
    p.add_argument("--T-list", type=parse_T, default=parse_T("8k,16k,32k,64k"))
    p.add_argument("--check-T", type=int, default=8192)
    p.add_argument("--torch-sel-max-T", type=int, default=65536)
    p.add_argument("--dry-run", action="store_true", help="CPU + TRITON_INTERPRET=1 at tiny T: checks the script")
    p.add_argument("--apply-best", action="store_true", help="sweep: use the fastest exact config afterwards")
    p.add_argument("--out", type=Path, default=Path("bench_scoring_out"))
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        global DEV
        DEV = "cpu"
        FAST.update(cmp="sdpa", win="sdpa", slc="sdpa")
    elif not torch.cuda.is_available():
        print("bench_scoring: needs a CUDA device", file=sys.stderr)
        return 2
    for part in args.what.split(","):
        t0 = time.time()
        try:
            PARTS[part.strip()](args, args.out)
        except Exception as e:  # noqa: BLE001
            log(f"part {part}: FAILED {type(e).__name__}: {e}")
            traceback.print_exc()
        log(f"part {part}: {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
