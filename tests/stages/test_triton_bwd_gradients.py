"""triton-bwd judges dq, dk and dv each on its own: a kernel with a correct forward and two
correct gradients, wrong only in dq (or only dk, or only dv), must turn the stage FAIL.

The wrong kernels are planted through ``stages._parity.KERNEL`` (the stage's test hook). They
compute the exact float64 answer (``_parity.reference``) and then spoil one gradient by 1%
(a plausible scaling bug in one accumulator), so the row's other two gradients are within
tolerance and only the spoiled one can make it red. A stage that accepted "any gradient right"
instead of "all gradients right" passes here and this test fails.
"""

from __future__ import annotations

import os

import pandas as pd
import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from nsa_core.testing import tolerance  # noqa: E402
from nsa_runner.stage import Status  # noqa: E402
from stages import _parity  # noqa: E402
from stages.triton_bwd import TritonBwd  # noqa: E402

GRADS = ("dq", "dk", "dv")


def _ctx(tmp_path, **options):
    from types import SimpleNamespace

    return SimpleNamespace(dir=tmp_path, device="cuda" if CUDA else "cpu", profile="quick", options=options,
                           run_id="t", stage="triton-bwd")


def _wrong_in(which: str, factor: float = 1.01):
    """A selection-attention 'kernel': exact forward and gradients, except ``which`` x ``factor``."""
    spoil = GRADS.index(which)

    class _Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, idx, cnt, bs):
            ctx.save_for_backward(q, k, v, idx, cnt)
            ctx.bs = bs
            return _parity.reference(q, k, v, idx, cnt, bs).to(q.dtype)

        @staticmethod
        def backward(ctx, do):
            q, k, v, idx, cnt = ctx.saved_tensors
            with torch.enable_grad():  # backward runs with grad mode off; the reference needs autograd
                _, *grads = _parity.reference(q, k, v, idx, cnt, ctx.bs, do=do)
            grads[spoil] = grads[spoil] * factor
            return (*(g.to(x.dtype) for g, x in zip(grads, (q, k, v), strict=True)), None, None, None)

    def kernel(q, k, v, idx, cnt, bs, scale=None, deterministic=False, **kw):
        assert scale is None
        return _Wrong.apply(q, k, v, idx, cnt, bs)

    return kernel


@pytest.fixture
def needs_triton():
    pytest.importorskip("triton", reason="needs triton: pip install triton")


@pytest.mark.parametrize("which", GRADS)
def test_a_kernel_wrong_in_one_gradient_only_fails_the_stage(which, tmp_path, monkeypatch, needs_triton):
    monkeypatch.setattr(_parity, "KERNEL", _wrong_in(which))
    res = TritonBwd().run(_ctx(tmp_path))
    assert res.status == Status.FAIL, res.reason
    df = pd.read_csv(tmp_path / "triton_bwd.csv")
    ran = df[df.status != "SKIP"]
    assert len(ran) == len(_parity.QUICK)
    assert (ran.status == "FAIL").all(), ran[["case", "status", "rel_dq", "rel_dk", "rel_dv"]]
    assert (ran.worst == which).all()  # the row names the gradient that is wrong
    for case in ran.itertuples():
        assert case.case in res.reason
        # the planted bug is in `which` only: the other two gradients are within tolerance,
        # so the FAIL can only come from judging every gradient
        for g in GRADS:
            rel = getattr(case, f"rel_{g}")
            if g == which:
                assert rel > case.tol
            else:
                assert rel <= case.tol, (case.case, g, rel)


def test_the_planted_kernels_are_right_where_they_claim(tmp_path, monkeypatch, needs_triton):
    """Control: with factor 1 the same planted kernel passes, so the FAILs above are the 1% alone."""
    monkeypatch.setattr(_parity, "KERNEL", _wrong_in("dk", factor=1.0))
    res = TritonBwd().run(_ctx(tmp_path))
    assert res.status == Status.PASS, res.reason
    df = pd.read_csv(tmp_path / "triton_bwd.csv")
    assert (df.status == "PASS").all() and len(df) == len(_parity.QUICK)
    # fp32 cases are judged at the IEEE fp32 tolerance, not the looser tf32 one (DESIGN §7)
    fp32 = df[df.dtype == "fp32"]
    assert len(fp32) and (fp32.tol == tolerance(torch.float32)).all()


@pytest.mark.parametrize("which", GRADS)
def test_a_non_finite_gradient_is_named_as_the_worst(which, tmp_path, monkeypatch, needs_triton):
    """NaN in one gradient: FAIL, and the row names that gradient (not the worst finite one)."""
    monkeypatch.setattr(_parity, "KERNEL", _wrong_in(which, factor=float("nan")))
    res = TritonBwd().run(_ctx(tmp_path, cases="B2-T70"))
    assert res.status == Status.FAIL, res.reason
    df = pd.read_csv(tmp_path / "triton_bwd.csv")
    assert df.status.tolist() == ["FAIL"] and df.worst.tolist() == [which]
    assert df[f"rel_{which}"].isna().all()
