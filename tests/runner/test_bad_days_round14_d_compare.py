"""Bad days, red-team round 14 part B, R5 (/tmp/rt14b/report.md B6, B7): ``compare`` keyed parity rows
by a joined string (an empty impl read as nsa_core's, ``impl:case`` joined with a colon) while the
reader refused duplicates on the raw columns: two distinct rows collapsed into one and a FAIL was
hidden, "no regression", exit 0. Through the CLI (the typer app) on fabricated run folders."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from nsa_runner.cli import app

try:  # tests/ is on sys.path under pytest's default (prepend) import mode
    from _runfolders import make_pair
except ImportError:  # pragma: no cover - run as a package
    from tests._runfolders import make_pair

HEAD = "impl,case,B,T,HQ,G,dk,dv,dtype,max_abs,rel_err,tol,status,note\n"
OK = "1,128,4,2,32,32,fp32,1e-7,1e-7,1e-3,PASS,\n"
BAD = "1,128,4,2,32,32,fp32,5.0,5.0,1e-3,FAIL,wrong\n"


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return make_pair(tmp_path / "runs", device="cpu")


def _cli(*args):
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.output
    return r


def test_empty_impl_beside_nsa_core_is_a_duplicate_named_never_a_hidden_fail(runs):
    (runs / "aaaaaaa" / "triton_fwd.csv").write_text(HEAD + "nsa_core,c1," + OK)
    (runs / "bbbbbbb" / "triton_fwd.csv").write_text(HEAD + "nsa_core,c1," + BAD + ",c1," + OK)
    r = _cli("compare", "aaaaaaa", "bbbbbbb", "--out", runs)
    assert r.exit_code == 2, r.output
    assert "no regression" not in r.output
    text = " ".join(r.output.split())
    assert "triton_fwd.csv" in text and "c1" in text and "more than once" in text and "lines 2 and 3" in text
    # the same rows under the report: refused too (report and compare read one table the same way)
    r = _cli("report", runs / "bbbbbbb")
    assert r.exit_code == 2 and "more than once" in " ".join(r.output.split())


def test_colon_in_impl_or_case_keeps_rows_apart(runs):
    (runs / "aaaaaaa" / "triton_fwd.csv").write_text(HEAD + "x,a:b," + OK)
    (runs / "bbbbbbb" / "triton_fwd.csv").write_text(HEAD + "x,a:b," + BAD + "x:a,b," + OK)
    r = _cli("compare", "aaaaaaa", "bbbbbbb", "--out", runs, "--json")
    doc = json.loads(r.stdout)
    par = [row for row in doc["rows"] if row["source"] == "triton_fwd.csv"]
    assert r.exit_code == 1 and doc["regressions"] >= 1, doc["verdict"]
    failing = [row for row in par if row["mark"] == "!"]
    assert [row["key"] for row in failing] == ["a:b [impl=x]"] and failing[0]["b"] == 5.0
    assert any(row["key"] == "b [impl=x:a]" and row["note"] == "only in B" for row in par)


def test_empty_impl_matches_nsa_core_of_the_other_run(runs):
    """Runs from before the impl column (or an empty cell) are nsa_core's: still paired across runs."""
    (runs / "aaaaaaa" / "triton_fwd.csv").write_text(HEAD + ",c1," + OK)
    (runs / "bbbbbbb" / "triton_fwd.csv").write_text(HEAD + "nsa_core,c1," + BAD)
    r = _cli("compare", "aaaaaaa", "bbbbbbb", "--out", runs, "--json")
    doc = json.loads(r.stdout)
    par = [row for row in doc["rows"] if row["source"] == "triton_fwd.csv"]
    assert r.exit_code == 1 and [(row["key"], row["mark"]) for row in par] == [("c1", "!")]


def test_report_takes_an_empty_impl_as_nsa_core_too(runs):
    """report.html's side-by-side table names the implementations as compare and the reader key them:
    an empty impl is nsa_core (it was shown as an implementation called "nan")."""
    (runs / "bbbbbbb" / "triton_fwd.csv").write_text(HEAD + ",c1," + OK + "other,c1," + BAD)
    r = _cli("report", runs / "bbbbbbb")
    assert r.exit_code == 0, r.output
    html = (runs / "bbbbbbb" / "report.html").read_text()
    assert "implementations side by side (nsa_core, other)" in html and "nan status" not in html
