"""What a new shape costs SDPA's cuDNN backend before its first result (issue 13's hypothesis).

    python bench/cudnn_build_cost.py        # CUDA only; ~1 min on an H100

fa2-probe's parity rows of the cuDNN path took ~1.1 s each on the warm H100 (stop 23: 31.8 s for
28 rows of tiny shapes) while the other paths' rows took milliseconds: the hypothesis is that torch
builds a cuDNN graph (execution plan) per new shape, forward and backward, in-process only, so
every stage pays it again for every length it touches. This prints, per shape, the first call
(build + run), the second call (run) and their difference, forward and forward+backward, for the
shapes the stages use (fa2-probe parity / bench, prefill-bench): if the difference is ~1 s per new
shape and ~0 for a repeated one, the cuDNN rows are where fa2-probe's parity time goes.
"""

from __future__ import annotations

import sys
import time


def main() -> int:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    if not torch.cuda.is_available():
        print("error: CUDA only (cuDNN's SDPA backend)", file=sys.stderr)
        return 2
    dev = "cuda"
    # (B, HQ, Tq, Tk, D, causal): tiny parity shapes, then bench / prefill lengths, then a repeat
    shapes = [(2, 4, 300, 300, 64, True), (2, 16, 1000, 1000, 128, True), (1, 8, 777, 777, 128, True),
              (1, 32, 4096, 4096, 128, True), (1, 64, 8192, 8192, 128, True), (2, 16, 1000, 1000, 128, True)]
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    print(f"{'B':>2} {'HQ':>3} {'Tq':>6} {'Tk':>6} {'D':>4}  {'fwd 1st':>9} {'fwd 2nd':>9} "
          f"{'f+b 1st':>9} {'f+b 2nd':>9}  build fwd / f+b (s)")
    total = 0.0
    for B, HQ, Tq, Tk, D, causal in shapes:
        q = torch.randn(B, HQ, Tq, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(B, HQ, Tk, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(B, HQ, Tk, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
        do = torch.randn(B, HQ, Tq, D, device=dev, dtype=torch.bfloat16)

        def fwd(q=q, k=k, v=v, causal=causal):  # bound now: called within this iteration only
            with torch.no_grad():
                sdpa(q, k, v, is_causal=causal)

        def fwdbwd(q=q, k=k, v=v, causal=causal, do=do):
            torch.autograd.grad(sdpa(q, k, v, is_causal=causal), (q, k, v), do)

        times = []
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            for fn in (fwd, fwd, fwdbwd, fwdbwd):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
        bf, bb = times[0] - times[1], times[2] - times[3]
        total += bf + bb
        print(f"{B:>2} {HQ:>3} {Tq:>6} {Tk:>6} {D:>4}  {times[0]:9.3f} {times[1]:9.3f} {times[2]:9.3f} "
              f"{times[3]:9.3f}  {bf:.3f} / {bb:.3f}")
    print(f"first-call cost over {len(shapes)} shapes: {total:.1f} s (the last shape repeats the second: ~0 if "
          "graphs are cached per shape in-process)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
