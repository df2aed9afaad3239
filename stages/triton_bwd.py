"""Stage ``triton-bwd``: Triton selection dq, dk, dv match the float64 reference (DESIGN §5).

Same case matrix as ``triton-fwd`` (``stages._parity``). Per case the kernel's forward +
backward (``deterministic=True``) against autograd through the float64 reference; the row's
max_abs / rel_err are the worst of dq, dk, dv (each also in its own column). On CUDA the
backward is run twice and must be bitwise identical (column ``bitwise_repeat``). Any case over
tolerance, or not reproducible, -> FAIL naming it. Writes triton_bwd.csv / triton_bwd.txt.
"""

from __future__ import annotations

from . import _parity


def _grads(q, k, v, idx, cnt, do, l_sel, kernel=None):
    qq, kk, vv = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    o = (kernel or _parity.kernel())(qq, kk, vv, idx, cnt, l_sel, deterministic=True)
    if tuple(o.shape) != tuple(do.shape):
        raise ValueError(f"output shape {tuple(o.shape)}, want {tuple(do.shape)} [B, T, HQ, dv]")
    o.backward(do)
    for name, x in (("q", qq), ("k", kk), ("v", vv)):
        if x.grad is None:
            raise ValueError(f"no gradient reached {name} (the output is not differentiable in it)")
    return qq.grad, kk.grad, vv.grad


def _measure(case, device, seed, kernel=None):
    import torch

    from nsa_core.testing import DTYPES_BY_NAME, compare

    q, k, v, idx, cnt, do = _parity.make_inputs(case, device, seed)
    dt = DTYPES_BY_NAME[case.dtype]
    got = _grads(q, k, v, idx, cnt, do, case.l_sel, kernel)
    repeat = "-"
    if device == "cuda":
        again = _grads(q, k, v, idx, cnt, do, case.l_sel, kernel)
        repeat = "yes" if all(torch.equal(a, b) for a, b in zip(got, again, strict=True)) else "NO"
        del again
    _, rdq, rdk, rdv = _parity.reference(q, k, v, idx, cnt, case.l_sel, do=do)
    cmps = {name: compare(g, r, dt) for name, g, r in zip(("dq", "dk", "dv"), got, (rdq, rdk, rdv), strict=True)}
    worst = max(cmps, key=lambda n: (not cmps[n].finite, cmps[n].rel_err / cmps[n].tol if cmps[n].finite else 0))
    w = cmps[worst]
    ok = all(c.ok for c in cmps.values()) and repeat != "NO"
    return {"max_abs": w.max_abs, "rel_err": w.rel_err, "tol": w.tol, "ok": ok, "worst": worst,
            "rel_dq": cmps["dq"].rel_err, "rel_dk": cmps["dk"].rel_err, "rel_dv": cmps["dv"].rel_err,
            "bitwise_repeat": repeat, "n": case.n, "l_sel": case.l_sel}


class TritonBwd(_parity.ParityStage):
    name = "triton-bwd"
    order = 40
    which = "bwd"
    description = "Triton selection attention dq/dk/dv vs autograd through the float64 reference"
    measure = staticmethod(_measure)
