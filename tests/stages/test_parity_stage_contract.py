"""What the triton-fwd / triton-bwd rows promise beyond PASS/FAIL (mutants that survived the
first ``make mutate`` run, docs/testing.md): the inputs are made on the run's device, a case is
judged at the tolerance of its dtype whatever dtype the kernel hands back, and the CSV carries
the case geometry columns (n, l_sel) and, off CUDA, ``bitwise_repeat`` = "-" (not checked).

The kernel is planted through ``stages._parity.KERNEL`` (the float64 reference, so no Triton
interpreter run is needed).
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from nsa_core.testing import DTYPES_BY_NAME, tolerance  # noqa: E402
from nsa_runner.stage import Status  # noqa: E402
from stages import _parity  # noqa: E402
from stages.triton_bwd import TritonBwd  # noqa: E402
from stages.triton_fwd import TritonFwd  # noqa: E402

STAGES = [pytest.param(TritonFwd, "fwd", id="triton-fwd"), pytest.param(TritonBwd, "bwd", id="triton-bwd")]


def _ctx(tmp_path, **options):
    return SimpleNamespace(dir=tmp_path, device="cuda" if CUDA else "cpu", profile="quick", options=options,
                           run_id="t", stage="x")


def _fp32_out(q, k, v, idx, cnt, bs, scale=None, deterministic=False, **kw):
    """Right to the dtype's precision, the output handed back as float32 (inputs may be fp16)."""

    class _F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            return _parity.reference(q, k, v, idx, cnt, bs).to(q.dtype).float()

        @staticmethod
        def backward(ctx, do):
            q, k, v = ctx.saved_tensors
            with torch.enable_grad():
                _, *g = _parity.reference(q, k, v, idx, cnt, bs, do=do)
            # autograd hands a leaf its gradient in the leaf's dtype whatever this returns, so
            # for triton-bwd the case dtype and the gradient dtype always agree
            return tuple(x.to(y.dtype) for x, y in zip(g, (q, k, v), strict=True))

    return _F.apply(q, k, v)


@pytest.fixture
def needs_triton():
    pytest.importorskip("triton", reason="needs triton: pip install triton")


@pytest.mark.parametrize("stage,which", STAGES)
def test_a_case_is_judged_at_its_dtype_tolerance(stage, which, tmp_path, monkeypatch, needs_triton):
    monkeypatch.setattr(_parity, "KERNEL", _fp32_out)
    res = stage().run(_ctx(tmp_path))
    df = pd.read_csv(tmp_path / f"triton_{which}.csv")
    for r in df.itertuples():
        assert r.tol == tolerance(DTYPES_BY_NAME[r.dtype]), (r.case, r.tol)
    assert res.status == Status.PASS, res.reason  # fp16 rounding is within the fp16 tolerance


@pytest.mark.parametrize("stage,which", STAGES)
def test_inputs_are_made_on_the_run_device_and_rows_carry_the_geometry(stage, which, tmp_path, monkeypatch,
                                                                       needs_triton):
    seen = []
    real = _parity.make_inputs

    def spy(case, device, seed):
        seen.append(device)
        return real(case, device, seed)

    monkeypatch.setattr(_parity, "make_inputs", spy)
    monkeypatch.setattr(_parity, "KERNEL", _fp32_out)
    ctx = _ctx(tmp_path)
    stage().run(ctx)
    assert seen and set(seen) == {ctx.device}
    df = pd.read_csv(tmp_path / f"triton_{which}.csv", keep_default_na=False)
    by = {c.id: c for c in _parity.QUICK}
    for r in df.itertuples():
        assert (int(r.n), int(r.l_sel)) == (by[r.case].n, by[r.case].l_sel)
    if which == "bwd":
        assert set(df.worst) <= {"dq", "dk", "dv"}
        if not CUDA:
            assert set(df.bitwise_repeat) == {"-"}  # the repeat check runs on CUDA only, and says so
