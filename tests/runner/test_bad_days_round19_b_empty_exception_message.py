"""Bad days, red-team round 19 (part B) U-3 (a code reading, CUDA-only through the CLI: the FA-2 / FA-4 / SDPA backend
baselines run on a GPU only): prefill-bench's ``check_baselines`` and decode-bench's ``_full_baselines`` worded a
baseline that raised as ``str(e).strip().splitlines()[0]`` inside their ``except``: an exception with an empty or
blank message (``RuntimeError("")``, ``AssertionError()``) raised IndexError there and the stage ERRORed instead of
skipping that baseline. CPU unit tests of the wording path (the same code, on the CPU's SDPA baseline)."""

from __future__ import annotations

import pytest
import torch

from stages import decode_bench, prefill_bench


@pytest.mark.parametrize("exc", [RuntimeError(""), AssertionError(), RuntimeError("  \n ")])
def test_prefill_check_baselines_skips_a_baseline_that_raised_with_no_message(monkeypatch, exc):
    def refuses(*a, **k):
        raise exc

    monkeypatch.setattr(prefill_bench, "full_attention_fns", refuses)
    o = dict(prefill_bench.DEFAULTS[("cpu", "quick")], baselines=["sdpa-default"], seed=0, parity_T=[16])
    lines = []
    skipped, problems, rows = prefill_bench.check_baselines(o, "cpu", lines.append)
    assert skipped == {"sdpa-default": f"cannot run here: {type(exc).__name__}: "}, skipped
    assert (problems, rows) == ([], [])
    assert lines == [f"baseline sdpa-default: skipped (cannot run here: {type(exc).__name__}: )"]


@pytest.mark.parametrize("exc", [RuntimeError(""), RuntimeError(" \n")])
def test_decode_full_baselines_words_a_backend_that_raised_with_no_message(monkeypatch, exc):
    def refuses(*a, **k):
        raise exc

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", refuses)
    qf, kf, vf = torch.randn(1, 1, 2, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
    outs, fns, problems = {}, {}, []
    tried, full_err = decode_bench._full_baselines(qf, kf, vf, 8 ** -0.5, "cpu", torch.float32, "t", outs, fns,
                                                   problems, full_decode=None)
    assert tried[0] == "default: unavailable ()", tried
    assert (full_err, fns, problems) == ({}, {}, [])
