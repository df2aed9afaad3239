"""prefill-bench times the implementations under test through their adapters (issue 15): an
implementation named by ``--impl`` that provides ``nsa_attention`` gets whole-NSA rows beside nsa and
full attention (path = its name); one that does not, or whose constraints exclude the workload and
its comparable variant, is named with the reason; fla goes through its adapter too (CPU: not timed,
the reason said)."""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (the default backend uses it)

from nsa_runner.stage import Status  # noqa: E402
from stages.prefill_bench import PrefillBench  # noqa: E402

SRC = """
from nsa_core import functional as F
from nsa_runner.impls import Constraints, Impl

def nsa(q, k_cmp, v_cmp, k_sel, v_sel, k_win, v_win, gates, cfg):
    return F.nsa_attention(q, k_cmp, v_cmp, k_sel, v_sel, k_win, v_win, gates, cfg, backend="reference")

def shared_only(case, part):
    return None if case.shared_kv and not case.window else "one K/V for all branches, no window"

IMPL = Impl("refk", {"nsa_attention": nsa})
SHARED = Impl("sharedk", {"nsa_attention": nsa}, Constraints(check=shared_only))
SELONLY = Impl("selonly", {"selection_attention": nsa})
FP16 = Impl("fp16k", {"nsa_attention": nsa}, Constraints(dtypes=("fp16",)))
"""


def _make(plugins):
    (plugins.site / "ref_kernels.py").write_text(textwrap.dedent(SRC))
    info = plugins.site / "ref_kernels-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ref-kernels\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[nsa_runner.impls]\nrefk = ref_kernels:IMPL\nsharedk = ref_kernels:SHARED\n"
                                           "selonly = ref_kernels:SELONLY\nfp16k = ref_kernels:FP16\n")
    importlib.invalidate_caches()
    sys.modules.pop("ref_kernels", None)


def _ctx(tmp_path, **opts):
    options = {o.dest: o.default for o in PrefillBench.options}
    options.update(opts)
    return SimpleNamespace(dir=tmp_path, device="cpu", profile="quick", options=options, run_id="t")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU behaviour (fla is not timed in the interpreter)")
def test_prefill_times_implementations_through_their_adapters(plugins, tmp_path):
    _make(plugins)
    res = PrefillBench().run(_ctx(tmp_path, impl="nsa_core,refk,sharedk,selonly,fp16k", T_list=[256],
                                  passes=["fwd"], rep_ms=20.0, seed=3))
    assert res.status == Status.PASS, res.reason
    df = pd.read_csv(tmp_path / "prefill.csv")
    for name in ("refk", "sharedk"):
        rows = df[df.path == name]
        assert list(rows.part) == ["whole"] and list(rows["pass"]) == ["fwd"] and (rows.ms > 0).all(), name
    assert "the same workload" in df[df.path == "refk"].note.iloc[0]
    assert "comparable variant" in df[df.path == "sharedk"].note.iloc[0]  # named: not the same workload
    assert not df.path.isin(["selonly", "fp16k", "fla"]).any()
    txt = (tmp_path / "prefill.txt").read_text()
    assert "selonly: does not provide nsa_attention" in txt
    assert "fp16k: dtype fp32 not supported (supports fp16)" in txt
    assert "fla: " in txt  # on CPU: the reason fla is not timed
