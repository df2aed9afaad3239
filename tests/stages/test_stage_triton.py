"""The triton-fwd / triton-bwd stages: they pass with the real kernel, FAIL (naming the cases)
with a deliberately wrong kernel injected through ``stages._parity.KERNEL``, SKIP with the
install hint when triton is missing. Run in-process with a fake ctx; CSVs read back with pandas.
"""

from __future__ import annotations

import importlib
import os
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from nsa_runner.stage import Status  # noqa: E402
from stages import _parity  # noqa: E402
from stages.triton_bwd import TritonBwd  # noqa: E402
from stages.triton_fwd import TritonFwd  # noqa: E402

STAGES = [pytest.param(TritonFwd, "fwd", id="triton-fwd"), pytest.param(TritonBwd, "bwd", id="triton-bwd")]


def _ctx(tmp_path, profile="quick", **options):
    return SimpleNamespace(dir=tmp_path, device="cuda" if CUDA else "cpu", profile=profile, options=options,
                           run_id="t", stage="x")


@pytest.fixture
def interpreted():
    pytest.importorskip("triton", reason="needs triton: pip install triton")
    if not CUDA:
        os.environ["TRITON_INTERPRET"] = "1"
        from nsa_core.selection import attention as triton_sel

        if type(triton_sel._k._fwd_kernel).__name__ != "InterpretedFunction":
            importlib.reload(triton_sel._k)


def test_stage_registration_metadata():
    assert (TritonFwd.name, TritonFwd.order, TritonFwd.requires) == ("triton-fwd", 30, ("triton",))
    assert (TritonBwd.name, TritonBwd.order, TritonBwd.requires) == ("triton-bwd", 40, ("triton",))


@pytest.mark.parametrize("stage,which", STAGES)
def test_stage_passes_with_the_real_kernel(stage, which, tmp_path, interpreted):
    # two quick cases keep CI short (the kernel tests cover the rest): h=2 with B=2, and ragged h=3
    res = stage().run(_ctx(tmp_path, cases="B2-T70,ragged"))
    assert res.status == Status.PASS, res.reason
    df = pd.read_csv(tmp_path / f"triton_{which}.csv")
    assert list(df.columns[: len(_parity.COLUMNS)]) == _parity.COLUMNS
    assert len(df) == 2 and set(df.status) == {"PASS"}
    assert (df.rel_err <= df.tol).all() and df.rel_err.notna().all()
    assert df.case.str.contains("ragged").sum() == 1
    assert (tmp_path / f"triton_{which}.txt").read_text().count("PASS") == 2
    assert set(res.files) == {f"triton_{which}.csv", f"triton_{which}.txt"}


def _scaled_reference(q, k, v, idx, cnt, bs, scale=None, deterministic=False, **kw):
    """Wrong on purpose: the right attention, 1% too large (a plausible scaling bug)."""
    from nsa_core.selection import reference as _reference

    o = _reference.selection_attention(q.float(), k.float(), v.float(), idx, cnt, bs, scale)
    return (o * 1.01).to(q.dtype)


def _drops_last_block(q, k, v, idx, cnt, bs, scale=None, deterministic=False, **kw):
    """Wrong on purpose: ignores the last selected block of every query (an off-by-one bug)."""
    from nsa_core.selection import reference as _reference

    cnt = (cnt - 1).clamp(min=0).to(torch.int32)
    idx = torch.where(torch.arange(idx.shape[-1], device=idx.device) < cnt[..., None], idx, -1).to(torch.int32)
    return _reference.selection_attention(q.float(), k.float(), v.float(), idx, cnt, bs, scale).to(q.dtype)


@pytest.mark.parametrize("wrong", [_scaled_reference, _drops_last_block], ids=["scaled", "drops-last-block"])
@pytest.mark.parametrize("stage,which", STAGES)
def test_wrong_kernel_makes_the_stage_fail(stage, which, wrong, tmp_path, monkeypatch):
    pytest.importorskip("triton", reason="needs triton: pip install triton")
    monkeypatch.setattr(_parity, "KERNEL", wrong)
    res = stage().run(_ctx(tmp_path))
    assert res.status == Status.FAIL
    df = pd.read_csv(tmp_path / f"triton_{which}.csv")
    ran = df[df.status != "SKIP"]
    assert len(ran) == len(_parity.QUICK) and (ran.status == "FAIL").all()
    assert (ran.rel_err > ran.tol).all()
    for case in ran.case:
        assert case in res.reason  # the FAIL names every failing case


@pytest.mark.parametrize("stage,which", STAGES)
def test_kernel_exception_is_a_failed_case(stage, which, tmp_path, monkeypatch):
    pytest.importorskip("triton", reason="needs triton: pip install triton")

    def broken(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(_parity, "KERNEL", broken)
    res = stage().run(_ctx(tmp_path, cases="ragged"))
    assert res.status == Status.FAIL and "ERROR" in res.reason
    assert pd.read_csv(tmp_path / f"triton_{which}.csv").status.tolist() == ["ERROR"]


@pytest.mark.parametrize("stage,which", STAGES)
def test_missing_triton_skips_with_install_hint(stage, which, tmp_path, monkeypatch):
    monkeypatch.setattr(_parity, "triton_problem", lambda: "triton is not installed")
    res = stage().run(_ctx(tmp_path))
    assert res.status == Status.SKIP and res.reason == "triton is not installed"
    assert "pip install triton" in res.hint
    assert not (tmp_path / f"triton_{which}.csv").exists()


@pytest.mark.skipif(CUDA, reason="CPU behaviour")
def test_cpu_without_interpreter_skips(tmp_path, monkeypatch):
    pytest.importorskip("triton", reason="needs triton: pip install triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    res = TritonFwd().run(_ctx(tmp_path))
    assert res.status == Status.SKIP and "TRITON_INTERPRET" in res.reason


@pytest.mark.skipif(CUDA, reason="CPU behaviour")
def test_paper_scale_cases_are_skip_rows_on_cpu(tmp_path, monkeypatch):
    """Full profile on CPU: paper-scale rows are SKIP (never PASS); nothing run -> stage SKIP."""
    pytest.importorskip("triton", reason="needs triton: pip install triton")
    res = TritonFwd().run(_ctx(tmp_path, profile="full", cases="T8K"))
    assert res.status == Status.SKIP
    df = pd.read_csv(tmp_path / "triton_fwd.csv")
    assert len(df) == 1 and df.status.tolist() == ["SKIP"] and "CUDA" in df.note[0]


def test_case_filter_matching_nothing_fails(tmp_path):
    pytest.importorskip("triton", reason="needs triton: pip install triton")
    res = TritonFwd().run(_ctx(tmp_path, cases="no-such-case"))
    assert res.status == Status.FAIL and "matches no case" in res.reason


def test_case_ids_are_unique_and_follow_the_scheme():
    ids = [c.id for c in _parity.FULL]
    assert len(ids) == len(set(ids))
    assert "B1-T8K-HQ64-G4-dk192-dv128-bf16-n16-l64" in ids
    assert any(c.T % c.l_sel for c in _parity.FULL if c.gpu_only)  # T not a multiple of the block
    assert {c.dtype for c in _parity.FULL if c.gpu_only} == {"bf16", "fp16", "fp32"}
    assert {c.dtype for c in _parity.QUICK} <= {"fp32", "fp16"}  # bf16 is garbage in the interpreter


# ---- numerics an implementation declares (fla on the H100: tf32 fp32 dots, atomics in backward) --
def _declared_kernel(noise: float, *, tf32: bool, deterministic: bool = True):
    """An implementation's selection kernel (the float64 reference plus relative noise of ``noise``,
    standing in for tf32 rounding) wrapped by _parity.kernel_for with the given declarations."""
    from nsa_runner.impls import Constraints, Impl

    def part(q, k, v, block_idx, block_count, cfg):
        o = _parity.reference(q, k, v, block_idx, block_count, cfg.l_sel).to(q.dtype)
        g = torch.Generator().manual_seed(1)
        return o * (1 + noise * torch.randn(o.shape, generator=g, dtype=o.dtype))

    impl = Impl("declared", {"selection_attention": part},
                Constraints(fp32_dots_tf32=tf32, deterministic_backward=deterministic))
    entry = SimpleNamespace(name="declared", impl=impl, dist="declared-kernels")
    return _parity.kernel_for(entry, _parity.QUICK[0])


def test_declared_tf32_is_checked_with_the_tf32_tolerance_and_said():
    from stages.triton_fwd import _measure

    case = _parity.QUICK[0]  # fp32
    assert case.dtype == "fp32"
    honest = _measure(case, "cpu", 0, _declared_kernel(3e-4, tf32=True))
    silent = _measure(case, "cpu", 0, _declared_kernel(3e-4, tf32=False))
    assert honest["ok"] and honest["tol"] == 1e-3 and "tf32" in honest["note"], honest
    assert not silent["ok"] and silent["tol"] == 1e-5 and "note" not in silent, silent
    worse = _measure(case, "cpu", 0, _declared_kernel(3e-3, tf32=True))  # tf32 does not excuse everything
    assert not worse["ok"] and worse["rel_err"] > 1e-3


def test_a_backward_that_is_not_repeatable_fails_only_when_it_claims_to_be():
    from stages.triton_bwd import repeat_verdict

    assert repeat_verdict(True, "NO", True) == (False, "")  # nsa_core: deterministic=True is a promise
    ok, note = repeat_verdict(True, "NO", False)  # declared atomics: reported, not failed
    assert ok and "atomics" in note
    assert repeat_verdict(False, "NO", False)[0] is False  # but the tolerance still holds
    assert repeat_verdict(True, "yes", True) == (True, "")
    k = _declared_kernel(0.0, tf32=False, deterministic=False)
    assert k.deterministic is False and k.tf32 is False
