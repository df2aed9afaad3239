"""Implementations under test (issue 15), through the CLI: fake implementation plugins (a module
plus a dist-info declaring ``[nsa_runner.impls]`` on sys.path, exactly what pip leaves behind) are
listed by ``nsa-run list --impls``; a correct one passes the parity stages (sanity, triton-fwd,
triton-bwd, selection-map); one with a planted bug (the selection's causal mask off by one, a select
that drops the last chosen block) FAILs them naming the cases; a broken or mismatched adapter is
reported, never crashes the CLI; cases outside an implementation's constraints are SKIP naming the
constraint; the README's example adapter works as written."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch

if not torch.cuda.is_available():  # before triton is imported (other modules' in-process kernels need it)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from nsa_runner.artifacts import load_manifest  # noqa: E402

pytest.importorskip("triton", reason="the parity stages need triton (the interpreter on CPU)")

REPO = Path(__file__).resolve().parents[2]
PARITY = "sanity,triton-fwd,triton-bwd,selection-map"

# the README's example kernel (a dense masked SDPA), extended with a select part; BUG = 1 plants the
# off-by-one causal mask (a query sees the next token) and a select that drops its last chosen block
KERNELS = """
import torch
from nsa_core import functional as F
from nsa_runner.impls import Constraints, Impl

BUG = {bug}

def selection_attention(q, k, v, block_idx, block_count, cfg):
    t = torch.arange(q.shape[1], device=q.device)
    live = torch.arange(block_idx.shape[-1], device=q.device) < block_count[..., None]
    blocks = torch.where(live, block_idx, -1).long()[..., None]
    mask = (blocks == t // cfg.l_sel).any(-2) & (t <= t[:, None, None] + BUG)
    mask = mask.transpose(1, 2).repeat_interleave(q.shape[2] // k.shape[2], 1)
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return o.transpose(1, 2).nan_to_num()

def select(q, k_cmp, cfg):
    idx, cnt = F.select_blocks(q, k_cmp, cfg, backend="reference")
    if BUG:
        cnt = (cnt - 1).clamp(min=1).to(torch.int32)
        idx = torch.where(torch.arange(idx.shape[-1]) < cnt[..., None], idx, -1).to(torch.int32)
    return idx, cnt

IMPL = Impl("{name}", {{"selection_attention": selection_attention, "select": select}},
            Constraints(dtypes=("fp32", "fp16")))
FP32 = Impl("{name}32", {{"selection_attention": selection_attention}}, Constraints(dtypes=("fp32",)))
SHORT = Impl("{name}short", {{"selection_attention": lambda *a: selection_attention(*a)[:, :-1]}})
"""


def make_impl(plugins, dist: str, module: str, source: str, impls: dict[str, str], version: str = "0.1.0") -> None:
    """A module and a dist-info declaring ``impls`` {entry name: "module:attr"} in nsa_runner.impls."""
    (plugins.site / f"{module}.py").write_text(textwrap.dedent(source))
    info = plugins.site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("[nsa_runner.impls]\n" + "".join(f"{k} = {v}\n" for k, v in impls.items()))
    importlib.invalidate_caches()
    sys.modules.pop(module, None)


@pytest.fixture
def fakes(plugins):
    make_impl(plugins, "good-kernels", "good_kernels", KERNELS.format(bug=0, name="goodk"),
              {"goodk": "good_kernels:IMPL", "goodk32": "good_kernels:FP32", "goodkshort": "good_kernels:SHORT"})
    make_impl(plugins, "bad-kernels", "bad_kernels", KERNELS.format(bug=1, name="buggy"), {"buggy": "bad_kernels:IMPL"})
    make_impl(plugins, "broken-kernels", "broken_kernels", "import no_such_module_xyz\n",
              {"broken": "broken_kernels:IMPL"})
    make_impl(plugins, "odd-kernels", "odd_kernels", """
        from nsa_runner.impls import Impl
        WRONG_PART = Impl("wrongpart", {"selection": print, "select": 3})
        NOT_IMPL = object()
    """, {"wrongpart": "odd_kernels:WRONG_PART", "notimpl": "odd_kernels:NOT_IMPL"})
    return plugins


def _stages(tmp_path, run="testrun"):
    return {s["name"]: s for s in load_manifest(tmp_path / run)["stages"]}


def test_list_impls_shows_parts_constraints_and_broken_adapters(fakes, cli):
    r = cli("list", "--impls", "--json", "--device", "cpu")
    assert r.exit_code == 1, r.stdout + r.stderr  # a broken adapter would fail a run: list says so
    rows = {x["name"]: x for x in json.loads(r.stdout)["impls"]}
    assert rows["nsa_core"]["source"] == "built-in" and rows["nsa_core"]["runs_here"]
    assert "selection_attention" in rows["nsa_core"]["parts"] and "select" in rows["nsa_core"]["parts"]
    good = rows["goodk"]
    assert good["source"] == "plugin good-kernels 0.1.0" and good["runs_here"] and not good["broken"]
    assert good["parts"] == ["select", "selection_attention"] and good["constraints"]["dtypes"] == ["fp32", "fp16"]
    assert rows["broken"]["broken"] and "No module named 'no_such_module_xyz'" in rows["broken"]["why_not"]
    assert "unknown part(s) ['selection']" in rows["wrongpart"]["why_not"]
    assert "part(s) ['select'] are not callable" in rows["wrongpart"]["why_not"]
    assert "not an nsa_runner.impls.Impl" in rows["notimpl"]["why_not"]
    assert "fla" in rows  # the built-in fla adapter is always listed: runs here, or says why not
    assert rows["fla"]["runs_here"] or rows["fla"]["why_not"]
    table = cli("list", "--impls", "--device", "cpu")
    assert "goodk" in table.stdout and "broken" in table.stdout


def test_unknown_impl_is_a_one_line_usage_error(fakes, cli, tmp_path):
    for args in (("stage", "triton-fwd", "--impl", "nope"), ("oneshot", "--impl", "goodk,nope"),
                 ("oneshot", "--impl", ",")):
        r = cli(*args, "--out", tmp_path, "--device", "cpu")
        assert r.exit_code == 2, (args, r.stdout + r.stderr)
        assert r.stderr.startswith("error:") and ("'nope'" in r.stderr or "comma-separated" in r.stderr)
        assert "known: nsa_core" in r.stderr or "comma-separated" in r.stderr
    assert not (tmp_path / "testrun").exists()  # nothing was run


def test_a_correct_fake_impl_passes_the_parity_stages(fakes, cli, tmp_path):
    r = cli("oneshot", "--only", PARITY, "--impl", "goodk", "--out", tmp_path, "--device", "cpu")
    assert r.exit_code == 0, r.stdout + r.stderr
    st = _stages(tmp_path)
    assert {n: s["status"] for n, s in st.items()} == {n: "PASS" for n in PARITY.split(",")}
    run = tmp_path / "testrun"
    for name in ("triton_fwd.csv", "triton_bwd.csv"):
        df = pd.read_csv(run / name)
        assert list(df.columns[:2]) == ["impl", "case"] and set(df.impl) == {"goodk"}
        assert (df.status == "PASS").all() and len(df) == 4 and (df.rel_err <= df.tol).all()
    sanity = json.loads((run / "sanity.json").read_text())
    names = [c["check"] for c in sanity["checks"]]
    assert sanity["impls"] == ["goodk"] and "module backward" not in names  # nsa_core's own checks not run
    for must in ("goodk slc forward vs fp64 reference", "goodk slc dq vs fp64 reference", "goodk slc causal",
                 "goodk select structure", "goodk select vs fp64 reference"):
        assert must in names, must
    assert all(c["ok"] for c in sanity["checks"])
    assert "goodk" in st["selection-map"]["reason"]


def test_a_planted_bug_fails_the_parity_stages_naming_the_cases(fakes, cli, tmp_path):
    r = cli("oneshot", "--only", PARITY, "--impl", "buggy", "--out", tmp_path, "--device", "cpu")
    assert r.exit_code == 1, r.stdout + r.stderr
    st = _stages(tmp_path)
    assert {n: s["status"] for n, s in st.items()} == {n: "FAIL" for n in PARITY.split(",")}
    for stage, csv in (("triton-fwd", "triton_fwd.csv"), ("triton-bwd", "triton_bwd.csv")):
        df = pd.read_csv(tmp_path / "testrun" / csv)
        assert (df.status == "FAIL").all() and (df.rel_err > df.tol).all()
        for case in df.case:
            assert f"buggy:{case}" in st[stage]["reason"]  # the FAIL names every failing case
        assert "--impl buggy" in st[stage]["hint"]  # and replays the first with this implementation
    assert "buggy slc forward vs fp64 reference" in st["sanity"]["reason"]
    assert "buggy: count == min(n, t // l' + 1)" in st["selection-map"]["reason"]


def test_broken_and_mismatched_adapters_are_errors_not_crashes(fakes, cli, tmp_path):
    r = cli("stage", "triton-fwd", "--impl", "broken,goodkshort,goodk", "--cases", "B2-T70", "--out", tmp_path,
            "--device", "cpu", "--json")
    assert r.exit_code == 1, r.stdout + r.stderr
    (stage,) = json.loads(r.stdout)["stages"]
    assert stage["status"] == "FAIL"
    df = pd.read_csv(tmp_path / "testrun" / "triton_fwd.csv").set_index("impl")
    assert df.loc["broken", "status"] == "ERROR" and "No module named" in df.loc["broken", "note"]
    assert df.loc["goodkshort", "status"] == "ERROR" and "output shape (2, 69, 4, 16)" in df.loc["goodkshort", "note"]
    assert df.loc["goodk", "status"] == "PASS"  # the others still run
    assert "broken:B2-T70" in stage["reason"] and "goodkshort:B2-T70" in stage["reason"]


def test_constraints_make_named_skips_and_impls_show_side_by_side(fakes, cli, tmp_path):
    r = cli("stage", "triton-fwd", "--impl", "nsa_core,goodk32", "--cases", "B2-T70,B1-T50", "--out", tmp_path,
            "--device", "cpu")
    assert r.exit_code == 0, r.stdout + r.stderr
    run = tmp_path / "testrun"
    df = pd.read_csv(run / "triton_fwd.csv")
    assert len(df) == 4 and list(df.impl) == ["nsa_core", "nsa_core", "goodk32", "goodk32"]
    skip = df[df.status == "SKIP"]
    assert list(skip.impl) == ["goodk32"] and "fp16" in skip.case.iloc[0]
    assert skip.note.iloc[0] == "goodk32: dtype fp16 not supported (supports fp32)"
    assert (df[df.status != "SKIP"].status == "PASS").all()
    reason = _stages(tmp_path)["triton-fwd"]["reason"]
    assert "nsa_core: 2 run, goodk32: 1 run" in reason and "goodk32: dtype fp16 not supported" in reason
    assert cli("report", run).exit_code == 0
    html = (run / "report.html").read_text()
    assert "implementations side by side (nsa_core, goodk32)" in html
    # compare keys rows by implementation: the same case of two implementations are two rows
    other = tmp_path / "other"
    shutil.copytree(run, other)
    edit = pd.read_csv(other / "triton_fwd.csv")
    edit.loc[(edit.impl == "goodk32") & (edit.status == "PASS"), "rel_err"] *= 100
    edit.to_csv(other / "triton_fwd.csv", index=False)
    r = cli("compare", run, other, "--json", "--all")
    rows = [x for x in json.loads(r.stdout)["rows"] if x["source"] == "triton_fwd.csv"]
    keys = {x["key"]: x for x in rows}
    case = df.case.iloc[0]
    assert case in keys and f"{case} [impl=goodk32]" in keys
    assert keys[f"{case} [impl=goodk32]"]["mark"] == "+" and keys[case]["mark"] != "+"


def test_readme_example_adapter_works_as_written(plugins, cli, tmp_path):
    """The adapter example in README.md, verbatim, registered as its comment says."""
    readme = (REPO / "README.md").read_text()
    block = re.search(r"## Validate your kernel.*?```python\n(.*?)```", readme, re.S).group(1)
    assert len(block.strip().splitlines()) <= 15
    entry = re.search(r'^# .*\[project\.entry-points\."nsa_runner\.impls"\]\s+(\w+) = "([\w.:]+)"$', block, re.M)
    name, value = entry.group(1), entry.group(2)
    make_impl(plugins, "my-kernel", value.split(":")[0], block, {name: value})
    r = cli("oneshot", "--only", "triton-fwd,triton-bwd", "--impl", name, "--out", tmp_path, "--device", "cpu")
    assert r.exit_code == 0, r.stdout + r.stderr
    for csv in ("triton_fwd.csv", "triton_bwd.csv"):
        df = pd.read_csv(tmp_path / "testrun" / csv)
        assert set(df.impl) == {name} and (df.status == "PASS").all() and len(df) == 4


def test_oneshot_hands_impl_only_to_stages_that_take_implementations():
    from nsa_runner.commands.oneshot import _with_impl
    from nsa_runner.registry import discover

    entries = {e.name: e for e in discover()}
    for name in ("sanity", "triton-fwd", "triton-bwd", "selection-map", "prefill-bench"):
        assert _with_impl(entries[name], {}, "nsa_core,goodk") == {"impl": "nsa_core,goodk"}, name
    # decode-bench takes implementations too; its decode kernel option is --kernel (auto/torch/triton/fused): kept
    assert _with_impl(entries["decode-bench"], {"kernel": "auto"}, "a,b") == {"kernel": "auto", "impl": "a,b"}
