"""Bad days, red-team round 16 part B, U4 (/tmp/rt16b/report.md): ``nsa-run report`` kept a regular junit.xml
whose content had been replaced (``garbage``) and said "kept": CI then read garbage. Root: whether the
summary files agree with manifest.json was told by the digest the runner notes when it writes them
(``reports_of``), which covers the manifest's side only, never the files' content. Now, in a run whose
files the runner wrote (that note agreeing), each regular summary.md / junit.xml / summary.json whose
content is not what the runner writes from manifest.json (summary.json: but for its ``written`` time)
is written again and said; unchanged ones are kept.

Through the CLI: a real run (a plugin stage, ``oneshot``), a file overwritten by hand, then ``report``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nsa_runner.cli import app

try:  # tests/ is on sys.path under pytest's default (prepend) import mode
    from _bad_days import cli_cmd
except ImportError:  # pragma: no cover - run as a package
    from tests._bad_days import cli_cmd

PLUGIN = """
from nsa_runner import Stage, StageResult, Status

class A(Stage):
    name, order, timeout_s = "a", 10, 120.0
    def run(self, ctx):
        (ctx.dir / "a.txt").write_text("a")
        return StageResult(Status.FAIL, "a failed on purpose", files=["a.txt"])
"""

NAMES = ("summary.md", "junit.xml", "summary.json")


def _cli(*args):
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.output
    return r


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    import importlib

    root = tmp_path_factory.mktemp("r16h_u4")
    site = root / "site"
    site.mkdir()
    (site / "r16h_u4_mod.py").write_text(textwrap.dedent(PLUGIN))
    info = site / "r16h_u4-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: r16h-u4\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[nsa_runner.stages]\na = r16h_u4_mod:A\n")
    importlib.invalidate_caches()
    env = dict(os.environ)
    repo = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(repo), env.get("PYTHONPATH", "")])
    out = root / "out"
    r = subprocess.run(cli_cmd("oneshot", "--device", "cpu", "--only", "a", "--out", out), env=env, text=True,
                       capture_output=True, timeout=180)
    assert r.returncode == 1, r.stderr[-2000:]  # a FAILed: the run's own result
    run = out / "testrun"
    assert all((run / n).is_file() for n in NAMES)
    return run


def _strip_written(text: str) -> dict:
    doc = json.loads(text)
    doc.pop("written")
    return doc


GARBAGE = {"junit.xml": "garbage", "summary.json": '{"schema_version": 1, "counts": {"failed": 0}}',
           "summary.md": "# all green\n"}


@pytest.mark.parametrize("names", [("junit.xml",), ("summary.json",), ("summary.md",), NAMES])
def test_report_rewrites_a_summary_file_whose_content_was_replaced(finished, tmp_path, names):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    before = {n: (run / n).read_bytes() for n in NAMES}
    for n in names:
        (run / n).write_text(GARBAGE[n])
    r = _cli("report", run, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert sorted(doc["rewritten"]) == sorted(names) and doc["left_alone"] == [], doc
    for n in NAMES:
        if n == "summary.json":
            assert _strip_written((run / n).read_text()) == _strip_written(before[n].decode()), n
        else:
            assert (run / n).read_bytes() == before[n], n
    assert "<failure" in (run / "junit.xml").read_text()
    r = _cli("report", run)  # as the runner wrote them now: kept, nothing rewritten
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "kept (written when the run ended)" in text and "rewritten" not in text, text


def test_report_says_which_file_it_rewrote(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / "junit.xml").write_text("garbage")
    (run / "summary.json").unlink()
    r = _cli("report", run)
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "junit.xml disagreed with manifest.json" in text and "summary.json missing, written" in text, text
    assert "kept" not in text, text


def test_report_keeps_unchanged_summaries(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    stamps = {n: os.stat(run / n).st_ino for n in NAMES}
    r = _cli("report", run, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["rewritten"] == []
    assert {n: os.stat(run / n).st_ino for n in NAMES} == stamps  # not even written again
