"""Where a cold machine's Triton compile time goes, measured on a CPU box (no GPU needed).

A cold `nsa-run oneshot --profile full` on the H100 spent 276 s in triton-fwd (7-89 s per case,
docs/benchmarks.md) compiling nsa_core's Triton kernels. This script finds which kernel
specialisations a stage's cases launch and how long each takes to compile for sm_90:

1. ``capture`` (a child process, TRITON_INTERPRET=1): runs each triton-fwd / triton-bwd case's
   code path with every Triton launch RECORDED and NOT executed (kernel, argument types,
   constexpr values, num_warps / num_stages). Outputs of skipped launches are uninitialised, so a
   case's host code may stop early (said so in the output); launches before that are recorded.
2. ``compile`` (this process, no interpreter): compiles each distinct specialisation with
   ``triton.compile`` for ``GPUTarget("cuda", 90, 32)`` (ptxas bundled with triton) into an empty
   cache, and prints the seconds per kernel, per case and in all.

It measures this machine's compiler (triton here may be newer than the GPU image's 3.6), not the
GPU's: compare kernels with each other, not with the H100's wall times.

    .venv/bin/python bench/compile_times.py [--stage triton-fwd|triton-bwd] [--cases 1,5]
    COMPILE_TIMES_SCORE=BM_fp32=256 .venv/bin/python bench/compile_times.py   # the scoring launch as before
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _capture(stage: str, cases: list[int] | None) -> None:
    """Child: record every launch of the stage's cases (interpreter mode, launches skipped)."""
    import torch
    from triton.runtime import interpreter

    from stages import _parity

    launches: list[dict] = []
    current = {"case": ""}

    def record(self, *args, grid, warmup, **kwargs):
        fn = self.fn
        opts = {k: kwargs.pop(k) for k in ("num_warps", "num_stages", "num_ctas") if k in kwargs}
        vals = {}
        for name, a in list(zip(self.arg_names, args, strict=False)) + list(kwargs.items()):
            if isinstance(a, torch.Tensor):
                vals[name] = ["tensor", str(a.dtype).replace("torch.", "")]
            elif isinstance(a, bool) or a is None or isinstance(a, (int, float, str)):
                vals[name] = ["value", a]
            else:
                vals[name] = ["value", str(a)]
        launches.append({"case": current["case"], "module": fn.__module__, "name": fn.__name__,
                         "args": vals, "opts": opts})

    interpreter.InterpretedFunction.run = record
    if os.environ.get("COMPILE_TIMES_SCORE"):  # e.g. BM_fp32=256: the scoring launch as before a change
        from nsa_core.selection import scoring

        for kv in os.environ["COMPILE_TIMES_SCORE"].split(","):
            k, _, v = kv.partition("=")
            scoring.CONFIG["score"][k.strip()] = int(v)
    # on the GPU make_inputs' select_blocks runs the Triton scoring (routing "auto"); here too
    from nsa_core import functional as F

    real_select = F.select_blocks
    F.select_blocks = lambda q, k_cmp, cfg, **kw: _select_then_reference(real_select, q, k_cmp, cfg, **kw)
    matrix = list(_parity.FULL)
    which = cases or list(range(1, len(matrix) + 1))
    for i in which:
        case = matrix[i - 1]
        current["case"] = f"{i}:{case.id}"
        try:
            q, k, v, idx, cnt, do = _parity.make_inputs(case, "cpu", 0)
            kern = _parity.kernel()
            if stage == "triton-fwd":
                kern(q, k, v, idx, cnt, case.l_sel)
            else:
                leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
                o = kern(*leaves, idx, cnt, case.l_sel)
                torch.autograd.grad(o, leaves, do)
        except Exception as e:  # noqa: BLE001 - skipped launches leave garbage: later host code may fail
            launches.append({"case": current["case"], "stopped": f"{type(e).__name__}: {str(e)[:120]}"})
    print(json.dumps(launches))


def _select_then_reference(real, q, k_cmp, cfg, **kw):
    """Record the Triton scoring launches (skipped), then return the reference's (real) choice so
    the case goes on with valid block indices."""
    try:
        real(q, k_cmp, cfg, backend="triton")
    except Exception:  # noqa: BLE001 - outputs of skipped launches are garbage
        pass
    return real(q, k_cmp, cfg, backend="reference")


_DT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "int32": "i32", "int64": "i64",
       "uint8": "u8", "bool": "i1", "int8": "i8"}


def _compile(rec: dict) -> tuple[float, str]:
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(rec["module"]), rec["name"])
    sig, consts = {}, {}
    for p in fn.params:
        kind, val = rec["args"].get(p.name, ["value", p.default if p.has_default else None])
        if p.is_constexpr:
            sig[p.name], consts[p.name] = "constexpr", val
        elif kind == "tensor":
            sig[p.name] = "*" + _DT[val]
        elif isinstance(val, bool):
            sig[p.name] = "i1"
        elif isinstance(val, int):
            sig[p.name] = "i32" if -2**31 <= val < 2**31 else "i64"
        elif isinstance(val, float):
            sig[p.name] = "fp32"
        elif val is None:
            sig[p.name], consts[p.name] = "constexpr", None
        else:
            raise TypeError(f"{p.name}: {val!r}")
    src = ASTSource(fn, sig, constexprs=consts)
    t0 = time.perf_counter()
    triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(rec["opts"]))
    key = ", ".join(f"{k}={v}" for k, v in consts.items() if v is not None)
    return time.perf_counter() - t0, key


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stage", default="triton-fwd", choices=("triton-fwd", "triton-bwd"))
    ap.add_argument("--cases", default="", help="1-based case numbers of stages._parity.FULL (default: all)")
    ap.add_argument("--capture-only", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    cases = [int(x) for x in a.cases.split(",") if x.strip()] or None
    if a.capture_only:
        _capture(a.stage, cases)
        return 0
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, __file__, "--capture-only", "--stage", a.stage, "--cases", a.cases],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    if out.returncode:
        print(out.stderr[-3000:])
        return 2
    launches = json.loads(out.stdout.strip().splitlines()[-1])
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cold-")
    seen: dict[str, float] = {}
    per_case: dict[str, float] = {}
    total = 0.0
    for rec in launches:
        if "stopped" in rec:
            print(f"  [{rec['case']}] host code stopped after the skipped launches: {rec['stopped']}")
            continue
        ident = json.dumps([rec["module"], rec["name"], rec["args"], rec["opts"]], sort_keys=True, default=str)
        if ident in seen:
            continue
        try:
            s, key = _compile(rec)
        except Exception as e:  # noqa: BLE001
            print(f"  [{rec['case']}] {rec['name']}: compile failed: {type(e).__name__}: {str(e)[:200]}")
            continue
        seen[ident] = s
        total += s
        per_case[rec["case"]] = per_case.get(rec["case"], 0.0) + s
        print(f"{s:7.2f} s  [{rec['case']}] {rec['name']}  {rec['opts']}  {key[:160]}")
    print("\nper case (new specialisations only):")
    for c, s in per_case.items():
        print(f"{s:7.2f} s  {c}")
    print(f"{total:7.2f} s  total, {len(seen)} specialisations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
