"""Stage ``triton-bwd``: Triton selection dq, dk, dv match the float64 reference (DESIGN §5).

Same case matrix as ``triton-fwd`` (``stages._parity``). Per case the kernel's forward +
backward (``deterministic=True``) against autograd through the float64 reference; the row's
max_abs / rel_err are the worst of dq, dk, dv (each also in its own column). On CUDA the
backward is run twice and must be bitwise identical (column ``bitwise_repeat``). Any case over
tolerance, or not reproducible, -> FAIL naming it; so is a kernel that wrote into one of its inputs (it
runs on copies, the reference on the originals). Writes triton_bwd.csv / triton_bwd.txt.
"""

from __future__ import annotations

from nsa_runner.impls import plain_tensor

from . import _parity

NAMES = ("q", "k", "v", "block_idx", "block_count", "do")  # the kernel's inputs, as a FAIL names them


def _grads(q, k, v, idx, cnt, do, l_sel, kernel=None):
    """(dq, dk, dv) of the kernel, and the names of the inputs its forward or backward changed: it runs on
    copies of its own (the reference reads the originals, round 16 B5), compared with them afterwards."""
    qq, kk, vv = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    idx_, cnt_, do_ = _parity.handed(idx, cnt, do)
    mine = (qq, kk, vv, idx_, cnt_, do_)

    def wrote() -> list[str]:
        return _parity.written(zip(NAMES, (q, k, v, idx, cnt, do), mine, strict=True))

    def also() -> str:
        w = wrote()
        return f"; it also wrote into {', '.join(w)}" if w else ""

    o = (kernel or _parity.kernel())(qq, kk, vv, idx_, cnt_, l_sel, deterministic=True)
    if tuple(o.shape) != tuple(do.shape):
        raise ValueError(f"output shape {tuple(o.shape)}, want {tuple(do.shape)} [B, T, HQ, dv]{also()}")
    o.backward(do_)
    for name, x in (("q", qq), ("k", kk), ("v", vv)):
        if x.grad is None:
            raise ValueError(f"no gradient reached {name} (the output is not differentiable in it){also()}")
    # what the implementation's backward left there, as plain tensors (round 15 B-R3)
    return tuple(plain_tensor(x.grad, f"d{name}", shape=tuple(x.shape), view=True)
                 for name, x in (("q", qq), ("k", kk), ("v", vv))), wrote()


def _measure(case, device, seed, kernel=None):
    import torch

    from nsa_core.testing import DTYPES_BY_NAME, compare

    q, k, v, idx, cnt, do = _parity.make_inputs(case, device, seed)
    dt = DTYPES_BY_NAME[case.dtype]
    got, wrote = _grads(q, k, v, idx, cnt, do, case.l_sel, kernel)
    claims = getattr(kernel, "deterministic", True)  # an implementation may declare atomics (not repeatable)
    repeat = "-"
    if device == "cuda":
        again, wrote_again = _grads(q, k, v, idx, cnt, do, case.l_sel, kernel)
        wrote = [n for n in NAMES if n in wrote or n in wrote_again]
        repeat = "yes" if all(torch.equal(a, b) for a, b in zip(got, again, strict=True)) else "NO"
        del again
    _, rdq, rdk, rdv = _parity.reference(q, k, v, idx, cnt, case.l_sel, do=do)
    tf32 = case.dtype == "fp32" and getattr(kernel, "tf32", False)
    cmps = {name: compare(g, r, dt, tf32=tf32)
            for name, g, r in zip(("dq", "dk", "dv"), got, (rdq, rdk, rdv), strict=True)}
    worst = max(cmps, key=lambda n: (not cmps[n].finite, cmps[n].rel_err / cmps[n].tol if cmps[n].finite else 0))
    w = cmps[worst]
    ok, note = repeat_verdict(all(c.ok for c in cmps.values()), repeat, claims)
    if tf32:
        note = "; ".join(filter(None, [note, "fp32 dots in tf32 (declared): tf32 tolerance"]))
    return {"max_abs": w.max_abs, "rel_err": w.rel_err, "tol": w.tol, "ok": ok, "worst": worst,
            "rel_dq": cmps["dq"].rel_err, "rel_dk": cmps["dk"].rel_err, "rel_dv": cmps["dv"].rel_err,
            "bitwise_repeat": repeat if claims or repeat != "NO" else "no (not claimed)", "n": case.n,
            "l_sel": case.l_sel, **({"note": note} if note else {}), **({"written": wrote} if wrote else {})}


def repeat_verdict(within_tol: bool, repeat: str, claims_deterministic: bool) -> tuple[bool, str]:
    """A backward that is not bitwise repeatable fails only when it claims to be (nsa_core's does,
    deterministic=True); one that declares atomics (fla) is reported, not failed."""
    if repeat == "NO" and not claims_deterministic:
        return within_tol, "backward not bitwise repeatable (declared: atomics)"
    return within_tol and repeat != "NO", ""


class TritonBwd(_parity.ParityStage):
    name = "triton-bwd"
    order = 40
    which = "bwd"
    description = "Triton selection attention dq/dk/dv vs autograd through the float64 reference"
    measure = staticmethod(_measure)
