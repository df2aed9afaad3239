"""Bad days, red-team round 16 part B, B3 (/tmp/rt16b/report.md): ``nsa-run report`` said "kept" and named
nothing (``--json``: ``left_alone: []``) when junit.xml / summary.json was a dangling link, a folder or a
FIFO and nothing else was missing: CI then read no junit at all. Root: the command named the odd files
of its rewrite plan only, and no plan is made while the files agree with manifest.json and none is
missing. Now every summary file that is not a regular file is named each time (stderr and ``--json``),
and left as it is (not the runner's: never followed, never replaced).

Through the CLI: a real run (a plugin stage, ``oneshot``), a file swapped by hand, then ``report``."""

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
        return StageResult(Status.PASS, "a holds", files=["a.txt"])
"""


def _cli(*args):
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.output
    return r


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    import importlib

    root = tmp_path_factory.mktemp("r16h_b3")
    site = root / "site"
    site.mkdir()
    (site / "r16h_b3_mod.py").write_text(textwrap.dedent(PLUGIN))
    info = site / "r16h_b3-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: r16h-b3\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[nsa_runner.stages]\na = r16h_b3_mod:A\n")
    importlib.invalidate_caches()
    env = dict(os.environ)
    repo = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(repo), env.get("PYTHONPATH", "")])
    out = root / "out"
    r = subprocess.run(cli_cmd("oneshot", "--device", "cpu", "--only", "a", "--out", out), env=env, text=True,
                       capture_output=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    run = out / "testrun"
    assert all((run / n).is_file() for n in ("summary.md", "junit.xml", "summary.json"))
    return run


def _dangling(p: Path) -> None:
    p.symlink_to("/nonexistent/r16h/x")


def _outside(p: Path) -> None:
    target = p.parent.parent / f"outside-{p.name}"
    target.write_text("not the run's")
    p.symlink_to(target)


def _folder(p: Path) -> None:
    p.mkdir()


def _fifo(p: Path) -> None:
    os.mkfifo(p)


KINDS = {"dangling": _dangling, "outside": _outside, "folder": _folder, "fifo": _fifo}


@pytest.mark.parametrize("name", ["junit.xml", "summary.json", "summary.md"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_report_names_an_odd_summary_file_when_nothing_is_missing(finished, tmp_path, name, kind):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / name).unlink()
    KINDS[kind](run / name)
    before = os.lstat(run / name)
    for _ in range(2):  # every time, not only once
        r = _cli("report", run)
        assert r.exit_code == 0, r.output
        text = " ".join(r.output.split())
        assert f"{name} is not a regular file" in text and "left as it is" in text, text
        r = _cli("report", run, "--json")
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        assert doc["left_alone"] == [name], doc
        assert name not in doc["rewritten"] and name not in doc["not_written"], doc
    after = os.lstat(run / name)  # left as it was: never followed, never replaced
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)
    others = [n for n in ("summary.md", "junit.xml", "summary.json") if n != name]
    assert all((run / n).is_file() for n in others)


def test_report_names_two_odd_files(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / "junit.xml").unlink()
    _dangling(run / "junit.xml")
    (run / "summary.json").unlink()
    _folder(run / "summary.json")
    r = _cli("report", run, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["left_alone"] == ["junit.xml", "summary.json"], doc
    text = " ".join(r.output.split())
    assert "junit.xml is not a regular file" in text and "summary.json is not a regular file" in text, text
