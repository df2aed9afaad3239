"""Bad days, status vocabulary (issue 16): a manifest whose stage status is not one of DESIGN §5's
PASS FAIL SKIP ERROR TIMEOUT (e.g. a hand-edited ``"fail"``) is refused when it is read: compare,
report and ``stage X`` into that run folder exit 2 with one line naming the stage and the word,
and change nothing."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from nsa_runner.artifacts import ManifestError, load_manifest
from nsa_runner.cli import app

try:  # tests/ is on sys.path under pytest's default (prepend) import mode
    from _runfolders import make_run, snapshot
except ImportError:  # pragma: no cover - run as a package
    from tests._runfolders import make_run, snapshot


def _cli(*args):
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.output
    return r


def _edit(folder, fn):
    p = folder / "manifest.json"
    m = json.loads(p.read_text())
    fn(m)
    p.write_text(json.dumps(m))


def _status(word, i=0):
    def fn(m):
        m["stages"][i]["status"] = word
    return fn


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "runs"
    make_run(root, "aaaaaaa")
    shutil.copytree(root / "aaaaaaa", root / "bbbbbbb")
    _edit(root / "bbbbbbb", lambda m: m.update(run_id="bbbbbbb"))
    return root


@pytest.mark.parametrize("word", ["fail", "pass", "OK", "", None, 1, ["PASS"]])
def test_an_unknown_status_is_refused_by_compare(runs, word):
    _edit(runs / "bbbbbbb", _status(word, 1))
    name = json.loads((runs / "bbbbbbb" / "manifest.json").read_text())["stages"][1]["name"]
    before = snapshot(runs)
    r = _cli("compare", "aaaaaaa", "bbbbbbb", "--out", runs)
    assert r.exit_code == 2, r.output
    assert f"status {word!r} is not one of PASS, FAIL, SKIP, ERROR, TIMEOUT" in r.output.replace("\n", "")
    assert repr(name) in r.output.replace("\n", "")
    assert snapshot(runs) == before


def test_an_unknown_status_is_refused_by_report_and_json_stays_clean(runs):
    _edit(runs / "aaaaaaa", _status("fail"))
    before = snapshot(runs)
    r = _cli("report", runs / "aaaaaaa")
    assert r.exit_code == 2, r.output
    assert "status 'fail' is not one of" in r.output.replace("\n", "")
    r = _cli("compare", "aaaaaaa", "bbbbbbb", "--out", runs, "--json")
    assert r.exit_code == 2 and r.stdout.strip() == "", r.stdout
    assert snapshot(runs) == before


def test_an_unknown_status_in_history_is_refused_too(runs):
    def fn(m):
        m["history"] = [{**m["stages"][0], "status": "passed", "moved_to": "history/x"}]
    _edit(runs / "aaaaaaa", fn)
    with pytest.raises(ManifestError, match=r"history\[0\].*status 'passed' is not one of"):
        load_manifest(runs / "aaaaaaa")


def test_every_design_status_is_read(runs):
    for i, word in enumerate(["PASS", "FAIL", "SKIP", "ERROR", "TIMEOUT"]):
        _edit(runs / "aaaaaaa", _status(word, i))
    assert [s["status"] for s in load_manifest(runs / "aaaaaaa")["stages"][:5]] == [
        "PASS", "FAIL", "SKIP", "ERROR", "TIMEOUT"]


def test_stage_into_a_run_folder_with_an_unknown_status_exits_2_touching_nothing(cli, tmp_path):
    out = tmp_path / "out"
    make_run(out, "testrun", device="cpu")
    _edit(out / "testrun", _status("Pass"))
    before = snapshot(out)
    r = cli("stage", "summary", "--out", out, "--device", "cpu")
    assert r.exit_code == 2, r.output
    assert "status 'Pass' is not one of" in r.output.replace("\n", "")
    assert snapshot(out) == before
