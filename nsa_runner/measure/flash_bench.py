"""Parity and speed of the flash paths (the fa2-probe stage's measurements).

``parity(...)``: each flash path, both branches, forward and backward (dq, dk, dv) against the
float64 reference on fresh random inputs, one row per (case, branch, path), compared with
``nsa_core.testing.compare``. ``bench(...)``: each path that passed parity against the SDPA
backend (``backend="sdpa"``) over a list of S, forward and forward+backward, median / p20 / p80 of the
shared timer (``nsa_runner.measure.timing.bench``). ``thresholds(...)``: the
smallest S from which a path stays >= 1.2x faster than SDPA (or None: never in the range).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from nsa_core import functional as F
from nsa_core.compression import fast as cmp_fast
from nsa_core.compression import reference as cmp_ref
from nsa_core.config import NSAConfig
from nsa_core.flash.adapters import PathUnavailable
from nsa_core.testing import DTYPE_NAMES, DTYPES_BY_NAME, case_id, compare
from nsa_core.window import fast as win_fast
from nsa_core.window import reference as win_ref
from nsa_runner.measure import timing

SPEEDUP = 1.2


@dataclass(frozen=True)
class Case:
    B: int
    T: int  # keys S
    HQ: int
    G: int
    D: int
    Tq: int | None = None  # queries = last Tq positions (None: Tq == T)
    why: str = ""

    def id(self, dtype, w: int) -> str:
        extra = {"w": w} if self.Tq is None else {"w": w, "q": self.Tq}
        return case_id(self.B, self.T, self.HQ, self.G, self.D, self.D, dtype, **extra)


def parity_cases(profile: str = "full") -> list[Case]:
    """The case matrix: T < l, T < w, T % d != 0, h in {1, 4, 16}, head dims 64/128, B > 1, Tq < T.

    The quick profile (a smoke check) keeps three of the seven: T < l, h=16 with T % d != 0 and B=2
    (head dim 128), and Tq < T (head dim 64): every path in both branches, both head dims, both dtypes,
    once; cuDNN builds a graph per configuration (~1 s each), so each case dropped is ~4 s of child time."""
    cases = [
        Case(1, 20, 4, 1, 64, why="T < l (no compressed token visible)"),
        Case(2, 300, 4, 4, 64, why="T < w, h=1, B=2"),
        Case(2, 1000, 16, 1, 128, why="T > w, T % d != 0, h=16, B=2"),
        Case(1, 777, 8, 2, 128, why="h=4, T % d != 0"),
        Case(2, 1000, 8, 2, 64, Tq=9, why="last 9 queries of 1000 (chunked prefill / decode)"),
    ]
    if profile != "full":
        return [cases[0], cases[2], cases[4]]
    return cases + [Case(1, 2085, 16, 4, 128, why="T > 4w, h=4"), Case(3, 600, 4, 1, 64, Tq=1, why="decode, B=3")]


def _inputs(c: Case, dev, seed: int):
    g = torch.Generator(device="cpu").manual_seed(seed)
    Tq = c.T if c.Tq is None else c.Tq
    q = torch.randn(c.B, Tq, c.HQ, c.D, generator=g, dtype=torch.float64)
    k = torch.randn(c.B, c.T, c.G, c.D, generator=g, dtype=torch.float64)
    v = torch.randn(c.B, c.T, c.G, c.D, generator=g, dtype=torch.float64)
    do = torch.randn(c.B, Tq, c.HQ, c.D, generator=g, dtype=torch.float64)
    return [x.to(dev) for x in (q, k, v, do)]


def _grads(fn, leaves, do):
    leaves = [x.detach().requires_grad_(True) for x in leaves]
    o = fn(*leaves)
    if o.requires_grad:
        gs = torch.autograd.grad(o, leaves, do.to(o.dtype), allow_unused=True)
    else:  # nothing visible (e.g. T < l): the output is a constant 0
        gs = [None] * len(leaves)
    gs = [torch.zeros_like(x) if gr is None else gr for x, gr in zip(leaves, gs, strict=True)]
    return o.detach(), gs


def _branch_fns(branch: str, cfg: NSAConfig, S: int, path: str | None):
    if branch == "cmp":
        if path is None:
            return lambda q, kc, vc: cmp_ref.compressed_attention(q, kc, vc, S, cfg)
        return lambda q, kc, vc: cmp_fast.compressed_attention(q, kc, vc, S, cfg, path=path)
    if path is None:
        return lambda q, k, v: win_ref.sliding_attention(q, k, v, cfg.w)
    return lambda q, k, v: win_fast.sliding_attention(q, k, v, cfg.w, path=path)


def parity(device: str, paths: dict[str, list[str]], dtypes, cases: list[Case], cfg: NSAConfig,
           seed: int = 0) -> list[dict]:
    """paths: {"cmp": [...], "win": [...]} -> rows (case, branch, path, dtype, rel errors, status)."""
    rows = []
    for n, c in enumerate(cases):
        q, k, v, do = _inputs(c, device, seed + n)
        S = c.T
        kc, vc = cmp_ref.compress_avg(k, cfg), cmp_ref.compress_avg(v, cfg)
        for branch in ("cmp", "win"):
            leaves = [q, kc, vc] if branch == "cmp" else [q, k, v]
            ref_o, ref_g = _grads(_branch_fns(branch, cfg, S, None), leaves, do)
            for dtype in dtypes:
                for path in paths.get(branch, []):
                    row = {"case": c.id(dtype, cfg.w), "branch": branch, "path": path, "dtype": DTYPE_NAMES[dtype],
                           "B": c.B, "T": c.T, "Tq": c.Tq or c.T, "HQ": c.HQ, "G": c.G, "D": c.D, "why": c.why}
                    t0 = time.perf_counter()
                    try:
                        o, gs = _grads(_branch_fns(branch, cfg, S, path), [x.to(dtype) for x in leaves], do)
                        if str(device).startswith("cuda"):
                            torch.cuda.synchronize()
                        row["wall_s"] = round(time.perf_counter() - t0, 6)  # fwd+bwd, JIT compile included
                    except PathUnavailable as e:
                        rows.append({**row, "status": "N/A", "note": str(e)[:200]})
                        continue
                    except Exception as e:  # noqa: BLE001 - a crash of a path is a FAIL row, not a crash
                        rows.append({**row, "status": "FAIL", "note": f"{type(e).__name__}: {str(e)[:200]}"})
                        continue
                    comps = {"o": compare(o, ref_o, dtype)}
                    for name, gr, rg in zip(("dq", "dk", "dv"), gs, ref_g, strict=True):
                        comps[name] = compare(gr, rg, dtype)
                    for name, cmp_ in comps.items():
                        row[f"rel_{name}"] = cmp_.rel_err
                    row["max_abs_o"] = comps["o"].max_abs
                    row["tol"] = comps["o"].tol
                    bad = [nm for nm, cmp_ in comps.items() if not cmp_.ok]
                    row["status"] = "FAIL" if bad else "PASS"
                    row["note"] = ("over tolerance / non-finite: " + ",".join(bad)) if bad else ""
                    rows.append(row)
    return rows


# Paths whose first call per configuration builds and compiles a graph in the process (measured
# on the H100, bench/cudnn_build_cost.py: cuDNN 0.8-4.8 s for the first forward + backward of a new
# configuration; nothing of it outlives the process). The case matrix gives each cuDNN parity row a
# new shape, so 28 rows cost ~40 s of fa2-probe's parity in one process, warm or not. ``parity_apart``
# runs such paths' rows in child processes side by side; the builds then overlap.
BUILDS_PER_PROCESS = ("sdpa-cudnn",)
CHILD_TIMEOUT_S = 600.0


def _row_order(cases: list[Case], paths: dict[str, list[str]], dtypes, cfg: NSAConfig):
    """Each row's place in ``parity``'s own order (case, branch, dtype, path)."""
    order = {}
    for n, c in enumerate(cases):
        for b, branch in enumerate(("cmp", "win")):
            for i, dtype in enumerate(dtypes):
                for j, path in enumerate(paths.get(branch, [])):
                    order[(c.id(dtype, cfg.w), branch, DTYPE_NAMES[dtype], path)] = (n, b, i, j)
    return order


def _ordered(rows: list[dict], cases: list[Case], paths: dict[str, list[str]], dtypes, cfg: NSAConfig):
    """``rows`` in ``parity``'s own order (rows computed apart come back in another)."""
    order = _row_order(cases, paths, dtypes, cfg)
    return sorted(rows, key=lambda r: order.get((r["case"], r["branch"], r["dtype"], r["path"]), (len(cases),)))


def _child_cmd() -> list[str]:
    from nsa_runner._python import python_m  # cwd (the run folder) never on sys.path (round 16 A10)

    return python_m("nsa_runner.measure.flash_bench")


def parity_apart(device: str, paths: dict[str, list[str]], dtypes, cases: list[Case], cfg: NSAConfig,
                 seed: int = 0, apart=BUILDS_PER_PROCESS, jobs: int | None = None,
                 child_cmd: list[str] | None = None, log=None,
                 apart_cases: list[int] | None = None, apart_dtypes=None) -> tuple[list[dict], dict]:
    """``parity`` with the rows of the ``apart`` paths computed in up to ``jobs`` child processes
    (cases dealt round-robin), started first and run beside this process's own rows. The same rows,
    inputs and order as ``parity``. A child that fails or times out is not a lost row: its cases
    are computed here afterwards, and the returned info says which and why.

    ``apart_cases`` (indices into ``cases``): the ``apart`` paths run on these cases only (the quick
    profile: one case, here, no child); the other paths on every case. None: every case.
    ``apart_dtypes`` (a subset of ``dtypes``): the same for dtypes (the quick profile: bf16 only).

    Returns (rows, info): info = {"children": n, "apart": [...], "fallback": [reason, ...],
    "apart_cases": [...]}."""
    log = log or (lambda msg: None)
    mine = {b: [p for p in ps if p not in apart] for b, ps in paths.items()}
    away = {b: [p for p in ps if p in apart] for b, ps in paths.items()}
    info = {"children": 0, "apart": sorted({p for ps in away.values() for p in ps}), "fallback": []}
    idx_away = list(range(len(cases))) if apart_cases is None else sorted(set(apart_cases))
    if apart_cases is not None:
        if not all(type(i) is int and 0 <= i < len(cases) for i in idx_away):
            raise ValueError(f"apart_cases {apart_cases!r}: indices into {len(cases)} cases")
        info["apart_cases"] = idx_away
    away_dtypes = list(dtypes) if apart_dtypes is None else [d for d in dtypes if d in apart_dtypes]
    if apart_dtypes is not None:
        if len(away_dtypes) != len(set(apart_dtypes)):
            raise ValueError(f"apart_dtypes {apart_dtypes!r}: not a subset of {list(dtypes)!r}")
        info["apart_dtypes"] = [DTYPE_NAMES[d] for d in away_dtypes]
    if jobs is None:
        from nsa_runner._text import parity_jobs

        jobs = parity_jobs() or min(8, max(1, (os.cpu_count() or 2) // 2))
    if info["apart"] and (jobs < 2 or len(idx_away) < 2) and (apart_cases is not None or apart_dtypes is not None):
        rows = parity(device, mine, dtypes, cases, cfg, seed=seed)  # the apart paths' few rows here, after
        for i in idx_away:
            rows += parity(device, away, away_dtypes, [cases[i]], cfg, seed=seed + i)
        return _ordered(rows, cases, paths, dtypes, cfg), info
    if not info["apart"] or jobs < 2 or len(cases) < 2:
        return parity(device, paths, dtypes, cases, cfg, seed=seed), info
    groups = [idx_away[k::jobs] for k in range(min(jobs, len(idx_away)))]
    tmp = tempfile.mkdtemp(prefix="nsa-run-parity-")
    env = dict(os.environ)  # the child imports this nsa_runner / nsa_core, as this process does
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")]).strip(os.pathsep)
    procs = []
    try:
        for k, idx in enumerate(groups):
            spec = {"device": device, "paths": away, "dtypes": [DTYPE_NAMES[d] for d in away_dtypes],
                    "cases": [asdict(cases[i]) for i in idx], "seeds": [seed + i for i in idx],
                    "cfg": cfg.to_dict(), "out": str(Path(tmp) / f"rows{k}.json")}
            spec_path = Path(tmp) / f"spec{k}.json"
            spec_path.write_text(json.dumps(spec))
            out = open(Path(tmp) / f"child{k}.log", "wb")  # noqa: SIM115 - closed below
            try:
                p = subprocess.Popen([*(child_cmd or _child_cmd()), str(spec_path)], stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=subprocess.STDOUT, env=env)
            except OSError as e:
                p = None
                info["fallback"].append(f"child {k} (cases {idx}) did not start: {e}")
            finally:
                out.close()
            procs.append((k, idx, p, spec["out"]))
        info["children"] = sum(1 for *_, p, _ in procs if p is not None)
        log(f"parity: {info['apart']} rows in {info['children']} child processes "
            f"({len(cases)} cases), the other paths here")
        rows = parity(device, mine, dtypes, cases, cfg, seed=seed)
        redo = []
        t_end = time.monotonic() + CHILD_TIMEOUT_S
        for k, idx, p, out_path in procs:
            if p is None:
                redo += idx
                continue
            try:
                rc = p.wait(timeout=max(1.0, t_end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                rc = "timeout"
            got = None
            if rc == 0:
                try:
                    got = json.loads(Path(out_path).read_text())
                except (OSError, ValueError) as e:
                    rc = f"0 but its rows are unreadable ({e})"
            if not isinstance(got, list):
                tail = (Path(tmp) / f"child{k}.log").read_text(errors="replace").strip().splitlines()[-3:]
                info["fallback"].append(f"child {k} (cases {idx}) exit {rc}: " + " | ".join(tail)[:300])
                redo += idx
                continue
            rows += got
        for i in sorted(redo):  # computed here: slower, never missing
            rows += parity(device, away, away_dtypes, [cases[i]], cfg, seed=seed + i)
        for why in info["fallback"]:
            log(f"parity: {why}; its rows were computed in this process")
    finally:
        for *_, p, _ in procs:
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        for f in Path(tmp).iterdir():
            f.unlink()
        os.rmdir(tmp)
    return _ordered(rows, cases, paths, dtypes, cfg), info


def _child_main(spec_path: str) -> int:
    """One child of ``parity_apart``: its cases' rows (each case with its own seed) as JSON."""
    spec = json.loads(Path(spec_path).read_text())
    cfg = NSAConfig(**spec["cfg"])
    dtypes = [DTYPES_BY_NAME[n] for n in spec["dtypes"]]
    rows = []
    for c, sd in zip(spec["cases"], spec["seeds"], strict=True):
        rows += parity(spec["device"], spec["paths"], dtypes, [Case(**c)], cfg, seed=sd)
    tmp = spec["out"] + ".part"
    Path(tmp).write_text(json.dumps(rows))
    os.replace(tmp, spec["out"])
    return 0


# ---------------------------------------------------------------------------------------------
# speed


def _timer(device: str):
    """The shared timer (nsa_runner.measure.timing.bench) as fn -> [median, p20, p80] ms."""
    def timer(fn):
        t = timing.bench(fn, device=device, rep_ms=60.0)
        return [t.ms, t.p20, t.p80]

    return timer, "nsa_runner.measure.timing.bench"


def bench(device: str, branch_paths: dict[str, list[str]], S_list: list[int], cfg: NSAConfig, *,
          B: int = 1, HQ: int = 32, G: int = 2, D: int = 128, dtype=torch.bfloat16, seed: int = 0,
          score_rows: bool = False) -> tuple[list, str]:
    """Rows (branch, path, S, fwd_ms, fwdbwd_ms, p20/p80, speedups vs sdpa). Returns (rows, timer name).

    ``score_rows``: also time what recomputing the selection scores in torch would cost next to the
    compressed branch (``_score_rows``: the design question of docs/benchmarks.md, "Selection
    scores: recompute vs kernel lse", settled since by the fused Triton scoring). Off by default:
    two slow fp32 torch passes per S that decide nothing in the stage (fa2-probe ``--score-rows``)."""
    timer, tname = _timer(device)
    rows = []
    for S in S_list:
        # drawn on the device: at S=64K these are 570M normals (B*S*(2*HQ+2*G)*D), seconds of
        # single-threaded CPU randn plus a 2.3 GB copy per S if drawn on the host (timing inputs:
        # their values do not matter, only that they are random and seeded)
        g = torch.Generator(device=device).manual_seed(seed + S)
        q, do = (torch.randn(B, S, HQ, D, generator=g, device=device, dtype=dtype) for _ in range(2))
        k, v = (torch.randn(B, S, G, D, generator=g, device=device, dtype=dtype) for _ in range(2))
        kc, vc = F.compress(k, cfg), F.compress(v, cfg)
        for branch in ("cmp", "win"):
            leaves = [q, kc, vc] if branch == "cmp" else [q, k, v]
            if branch == "cmp":
                def sdpa(q_, k_, v_, S=S):
                    return cmp_ref.compressed_attention(q_, k_, v_, S, cfg, engine="sdpa")
            else:
                def sdpa(q_, k_, v_):
                    return win_ref.sliding_attention(q_, k_, v_, cfg.w, engine="sdpa")
            cands = [("sdpa", sdpa)] + [(p, _branch_fns(branch, cfg, S, p))
                                        for p in branch_paths.get(branch, [])]
            base = None
            for name, fn in cands:
                row = {"branch": branch, "kind": "baseline" if name == "sdpa" else "flash", "path": name, "S": S,
                       "B": B, "HQ": HQ, "G": G, "D": D, "dtype": DTYPE_NAMES[dtype]}
                t0 = time.perf_counter()
                try:
                    fw = timer(lambda fn=fn, lv=leaves: fn(*lv))
                    lv = [x.detach().requires_grad_(True) for x in leaves]

                    def fb(fn=fn, lv=lv, do=do):
                        o = fn(*lv)
                        torch.autograd.grad(o, lv, do)

                    fbw = timer(fb)
                except torch.cuda.OutOfMemoryError as e:
                    rows.append({**row, "note": f"OOM: {str(e)[:120]}"})
                    torch.cuda.empty_cache()
                    continue
                row.update(fwd_ms=fw[0], fwd_p20=fw[1], fwd_p80=fw[2], fwdbwd_ms=fbw[0], fwdbwd_p20=fbw[1],
                           fwdbwd_p80=fbw[2], note="", bench_s=round(time.perf_counter() - t0, 3))
                if name == "sdpa":
                    base = row
                if base is not None:
                    row["speedup_fwd"] = base["fwd_ms"] / row["fwd_ms"]
                    row["speedup_fwdbwd"] = base["fwdbwd_ms"] / row["fwdbwd_ms"]
                rows.append(row)
            if branch == "cmp" and score_rows:  # what recomputing the selection scores costs, beside the branch
                rows += _score_rows(timer, q, kc, S, cfg, {"B": B, "HQ": HQ, "G": G, "D": D,
                                                           "dtype": DTYPE_NAMES[dtype]})
        torch.cuda.empty_cache()
    return rows, tname


def _score_rows(timer, q, kc, S, cfg, shape) -> list[dict]:
    """Selection needs p_cmp for every visible compressed token. Time (a) functional.block_scores
    (recompute: q.k, softmax, head sum, overlap map) and (b) its floor with a kernel-provided lse:
    the q.k^T products alone, which p = exp(q.k*scale - lse) would still need."""
    B, Tq, HQ, D = q.shape
    G = kc.shape[2]
    qg = q.reshape(B, Tq, G, HQ // G, D)
    chunk = max(1, F._SELECT_BUDGET // max(1, B * HQ * kc.shape[1]))

    def qk_only():
        for c0 in range(0, Tq, chunk):
            torch.einsum("bcghd,bsgd->bcghs", qg[:, c0:c0 + chunk].float(), kc.float())

    out = []
    for name, fn, note in (
        ("block_scores (recompute p_cmp)", lambda: F.block_scores(q, kc, S, cfg),
         "selection scores as nsa_core computes them (fp32)"),
        ("q.k^T only (floor with lse)", qk_only, "what returning the kernel's lse would still leave to compute"),
    ):
        t0 = time.perf_counter()
        t = timer(fn)
        out.append({"branch": "cmp", "kind": "scores", "path": name, "S": S, **shape, "fwd_ms": t[0], "fwd_p20": t[1],
                    "fwd_p80": t[2], "note": note, "bench_s": round(time.perf_counter() - t0, 3)})
    return out


def thresholds(rows: list[dict], speedup: float = SPEEDUP) -> dict:
    """{branch: {path: {"min_len", "max_measured", "speedup_at_max", "speedups"}}}: the smallest
    measured S from which the path stays >= ``speedup`` x faster than sdpa, forward AND
    forward+backward (the smaller of the two speedups, also per measured S in ``speedups``)."""
    out: dict = {}
    by: dict = {}
    for r in rows:
        if r.get("kind") != "flash":  # sdpa itself, the score timings
            continue
        by.setdefault((r["branch"], r["path"]), []).append(r)
    for (branch, path), rs in by.items():
        rs = sorted(rs, key=lambda r: r["S"])
        wins = [(r["S"], min(r.get("speedup_fwd", 0.0), r.get("speedup_fwdbwd", 0.0))) for r in rs]
        min_len = None
        for i in range(len(wins) - 1, -1, -1):
            if wins[i][1] >= speedup and not math.isnan(wins[i][1]):
                min_len = wins[i][0]
            else:
                break
        out.setdefault(branch, {})[path] = {
            "min_len": min_len, "max_measured": rs[-1]["S"], "speedup_at_max": round(wins[-1][1], 3),
            # per measured S (JSON keys are strings): routing picks the fastest path there
            "speedups": {str(S): round(x, 3) for S, x in wins if not math.isnan(x)}}
    return out


if __name__ == "__main__":  # a child of parity_apart
    sys.exit(_child_main(sys.argv[1]))
