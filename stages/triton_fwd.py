"""Stage ``triton-fwd``: the Triton selection forward matches the float64 reference (DESIGN §5);
with ``--impl a,b`` the selection attention of each implementation under test (``_parity``).

Case matrix per profile (``stages._parity``): quick = tiny shapes in the Triton interpreter on
CPU (fp32/fp16); full = the quick matrix plus paper-scale cases on CUDA (HQ=64, G=4, dk=192,
dv=128, n=16, l'=64, T up to 8K, bf16/fp16/fp32, B=2, h=1/12/16, T not a multiple of l').
Each case is a row of triton_fwd.csv (case, B, T, HQ, G, dk, dv, dtype, max_abs, rel_err, tol,
status, ...) and of the readable triton_fwd.txt. Any case over tolerance -> FAIL naming it. The kernel
gets copies of the inputs; one that wrote into an input FAILs naming it (the reference reads the originals).
"""

from __future__ import annotations

from . import _parity

NAMES = ("q", "k", "v", "block_idx", "block_count")  # the kernel's inputs, as a FAIL names them


def _measure(case, device, seed, kernel=None):
    import torch

    from nsa_core.testing import DTYPES_BY_NAME, compare

    inputs = _parity.make_inputs(case, device, seed)[:5]  # q, k, v, block_idx, block_count
    mine = _parity.handed(*inputs)  # the kernel's own copies: the reference reads inputs it never held (B5)
    with torch.no_grad():
        o = (kernel or _parity.kernel())(*mine, case.l_sel)
    wrote = _parity.written(zip(NAMES, inputs, mine, strict=True))
    want = (case.B, case.T, case.HQ, case.dv)
    if not isinstance(o, torch.Tensor) or tuple(o.shape) != want:
        got = tuple(o.shape) if isinstance(o, torch.Tensor) else type(o).__name__
        also = f"; it also wrote into {', '.join(wrote)}" if wrote else ""
        raise ValueError(f"output shape {got}, want {want} [B, T, HQ, dv]{also}")
    ref = _parity.reference(*inputs, case.l_sel)
    tf32 = case.dtype == "fp32" and getattr(kernel, "tf32", False)  # declared by the implementation
    c = compare(o, ref, DTYPES_BY_NAME[case.dtype], tf32=tf32)
    return {"max_abs": c.max_abs, "rel_err": c.rel_err, "tol": c.tol, "ok": c.ok, "n": case.n, "l_sel": case.l_sel,
            **({"note": "fp32 dots in tf32 (declared): tf32 tolerance"} if tf32 else {}),
            **({"written": wrote} if wrote else {})}


class TritonFwd(_parity.ParityStage):
    name = "triton-fwd"
    order = 30
    which = "fwd"
    description = "Triton selection attention forward vs the float64 reference over a case matrix"
    measure = staticmethod(_measure)
