"""A/B timing of the Triton selection attention: the current kernels vs an old copy (issue 17).

Issue 17 made the selection kernels share @triton.jit helpers instead of repeating their bodies;
this bench checks that the GPU timings did not get slower. It imports the selection attention
from two module paths and times both in turns (``nsa_runner.measure.timing.bench_round_robin``,
one call of each per round, CUDA events, L2 flushed before each call):

    new   nsa_core.selection.attention (+ nsa_core.selection._attention_kernels)
    old   the two files of commit d0d628e, placed in an ignored folder (default build/ab_old):
              git show d0d628e:nsa_core/_triton_sel_kernels.py > build/ab_old/_triton_sel_kernels.py
              git show d0d628e:nsa_core/triton_sel.py          > build/ab_old/triton_sel.py
          (their two nsa_core imports are redirected to the old kernels and today's q/k/v checker)

Workload (bench_selection.py's): B=1, HQ=64, G=4, dk=dv=128, n=16, l'=64, bf16, T=64K; block
indices = forced (0 + the two local blocks) + random distinct causal blocks. Prints fwd and
fwd+bwd for both, and old/new (> 1: the new kernels are faster). Both outputs and gradients are
compared first (same inputs: they must agree to the dtype's tolerance, else exit 1).

    python bench/ab_selection_kernels.py                       # CUDA, T=64K
    TRITON_INTERPRET=1 python bench/ab_selection_kernels.py --device cpu --T 256 --dtype fp32 --small --iters 1  # smoke
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

OLD_DIR = ROOT / "build" / "ab_old"
OLD_FILES = ("_triton_sel_kernels.py", "triton_sel.py")


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # @triton.jit reads the source through the module
    spec.loader.exec_module(mod)
    return mod


def load_old(folder: Path):
    """The old selection attention module, its kernels imported from ``folder``."""
    missing = [f for f in OLD_FILES if not (folder / f).is_file()]
    if missing:
        raise SystemExit(f"ab_selection_kernels: {folder} lacks {', '.join(missing)}; prepare it with\n"
                         + "\n".join(f"  git show d0d628e:nsa_core/{f} > {folder}/{f}" for f in OLD_FILES))
    _load("ab_old_kernels", folder / "_triton_sel_kernels.py")
    src = (folder / "triton_sel.py").read_text()
    subs = {"from nsa_core._reference import _check_qkv": "from nsa_core._shapes import check_qkv as _check_qkv",
            "from nsa_core import _triton_sel_kernels as _k": "import ab_old_kernels as _k"}
    for a, b in subs.items():
        if a not in src:
            raise SystemExit(f"ab_selection_kernels: {folder}/triton_sel.py is not d0d628e's (no line {a!r})")
        src = src.replace(a, b)
    shim = folder / "ab_old_attention.py"
    shim.write_text(src)
    return _load("ab_old_attention", shim)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", type=Path, default=OLD_DIR, help="folder with d0d628e's two selection files")
    ap.add_argument("--T", type=int, default=64 * 1024)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    ap.add_argument("--rep-ms", type=float, default=300.0, help="timed time per function and round")
    ap.add_argument("--iters", type=int, default=None, help="timed rounds (default: by --rep-ms)")
    ap.add_argument("--small", action="store_true",
                    help="HQ=4, G=2, d=16 instead of the paper's HQ=64, G=4, d=128 (a smoke run in the interpreter)")
    args = ap.parse_args(argv)

    import torch
    from bench_selection import HQ, L_SEL, B, D, G, block_indices

    if args.small:
        HQ, G, D = 4, 2, 16

    from nsa_core.selection import attention as new
    from nsa_core.testing import DTYPES_BY_NAME, compare
    from nsa_runner.measure.timing import bench_round_robin

    old = load_old(args.old)
    dev, dt, T = args.device, DTYPES_BY_NAME[args.dtype], args.T
    gen = torch.Generator(device=dev).manual_seed(0)

    def rnd(*s):
        return torch.randn(*s, generator=gen, device=dev, dtype=torch.float32).to(dt)

    q, k, v, do = rnd(B, T, HQ, D), rnd(B, T, G, D), rnd(B, T, G, D), rnd(B, T, HQ, D)
    idx, cnt = block_indices(T, 1, device=dev, groups=G)
    leaves = [x.requires_grad_() for x in (q, k, v)]

    def fwd(mod):
        return lambda: mod.selection_attention(q, k, v, idx, cnt, L_SEL)

    def fwd_bwd(mod):
        def run():
            for x in leaves:
                x.grad = None
            mod.selection_attention(*leaves, idx, cnt, L_SEL).backward(do)
        return run

    outs = {}
    for name, mod in (("new", new), ("old", old)):
        fwd_bwd(mod)()
        outs[name] = [mod.selection_attention(q, k, v, idx, cnt, L_SEL).detach()] + [x.grad.clone() for x in leaves]
    agree = [compare(a, b, dt) for a, b in zip(outs["new"], outs["old"], strict=True)]
    print("new vs old (o, dq, dk, dv):", ", ".join(f"{c.rel_err:.2e}" for c in agree))
    if not all(c.ok for c in agree):
        print("FAIL: the new kernels do not reproduce the old ones")
        return 1

    fns = {f"{w} {m}": f(mod) for w, f in (("fwd", fwd), ("fwd+bwd", fwd_bwd)) for m, mod in (("new", new),
                                                                                            ("old", old))}
    timings, _ = bench_round_robin(fns, device=dev, rep_ms=args.rep_ms, iters=args.iters,
                                   warmup=0 if args.iters else None)
    print(f"T={T} B={B} HQ={HQ} G={G} d={D} n=16 l'={L_SEL} {args.dtype} on "
          f"{torch.cuda.get_device_name() if dev == 'cuda' else dev}")
    for w in ("fwd", "fwd+bwd"):
        tn, to = timings[f"{w} new"], timings[f"{w} old"]
        print(f"{w:8s} new {tn}\n{'':8s} old {to}\n{'':8s} old/new = {to.ms / tn.ms:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
