"""Bad days, red-team round 15 part B, U1 (/tmp/rt15b/report.md): ``nsa-run report`` wrote a missing
summary.md again but left a deleted junit.xml or summary.json missing (what CI reads) and still said
"summary.md ... kept (written when the run ended)". Root: ``plan_run_reports`` returned nothing to
write whenever the three agreed with the manifest (its ``reports_of`` note), whatever was missing.
Now every missing one is written from manifest.json (the others kept), and said.

Through the CLI: a real run (a plugin stage, ``oneshot``), files deleted by hand, then ``report``."""

from __future__ import annotations

import json
import subprocess
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
    """One finished run (stage a FAIL), copied per test."""
    import importlib
    import os
    import textwrap

    root = tmp_path_factory.mktemp("r15r_u1")
    site = root / "site"
    site.mkdir()
    (site / "r15r_u1_mod.py").write_text(textwrap.dedent(PLUGIN))
    info = site / "r15r_u1-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: r15r-u1\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[nsa_runner.stages]\na = r15r_u1_mod:A\n")
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


@pytest.mark.parametrize("gone", [("junit.xml",), ("summary.json",), ("junit.xml", "summary.json"), NAMES])
def test_report_writes_every_missing_summary_file_again(finished, tmp_path, gone):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    before = {n: (run / n).read_bytes() for n in NAMES}
    for n in gone:
        (run / n).unlink()
    r = _cli("report", run)
    assert r.exit_code == 0, r.output
    for n in NAMES:
        assert (run / n).is_file(), (n, r.output)
        if n == "summary.json":  # as the run wrote it (rendered from the same manifest), but when
            now, then = json.loads((run / n).read_text()), json.loads(before[n])
            assert {**now, "written": None} == {**then, "written": None}
        else:
            assert (run / n).read_bytes() == before[n], n
    assert "<failure" in (run / "junit.xml").read_text()
    text = " ".join(r.output.split())
    others = [n for n in gone if n != "summary.md"]
    assert f"{', '.join(others)}: missing, written from manifest.json" in text, text
    if "summary.md" in gone:
        assert "written (the run had none)" in text and "kept" not in text, text
    else:
        assert "kept (written when the run ended)" in text, text
    assert "not written" not in text, text
    r = _cli("report", run)  # nothing missing now: kept, nothing said to be written
    assert r.exit_code == 0 and "kept" in r.output and "missing" not in r.output, r.output


def test_report_json_lists_what_it_wrote(finished, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / "junit.xml").unlink()
    r = _cli("report", run, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["rewritten"] == ["junit.xml"] and doc["not_written"] == [], doc
    assert (run / "junit.xml").is_file()
