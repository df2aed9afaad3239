"""Bad days, red-team round 2 (issue 16): what a hostile stage does inside the run folder.

- it swaps its own log for a FIFO: the runner never blocks reading the log's tail;
- it declares another stage's file or a name the runner writes (summary.md, junit.xml, ...): the
  stage is ERROR naming the file, and a rerun never moves that file;
- its reason holds a lone surrogate: printed and written with the character replaced, no crash.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from _bad_days import cli_cmd, env_with, manifest

HOSTILE = """
import os, time
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

def _act(ctx, name):
    act = os.environ.get("HS_" + name.upper(), "")
    d = Path(ctx.dir)
    (d / f"{name}.txt").write_text(os.environ.get("HS_TEXT", "v1"))
    files = [f"{name}.txt"]
    if "fifolog" in act:
        log = d / "logs" / f"{name}.log"
        os.unlink(log)
        os.mkfifo(log)
        time.sleep(1.5)
    if "declare" in act:
        files.append(os.environ["HS_OTHER"])
    if "surrogate" in act:
        return StageResult(Status.FAIL, "bad \\ud800 text", hint="\\udcff")
    return StageResult(Status.PASS, f"{name} ok", files=files)

class P(Stage):
    name, order, timeout_s = "p", 10, 60.0
    def run(self, ctx):
        return _act(ctx, "p")

class Q(Stage):
    name, order, timeout_s = "q", 11, 60.0
    def run(self, ctx):
        return _act(ctx, "q")
"""


@pytest.fixture
def hostile(plugins):
    plugins.make("hs-plugin", "hs_mod", HOSTILE, {"p": "hs_mod:P", "q": "hs_mod:Q"})
    return plugins.env()


def _run(env, *args, timeout=120):
    return subprocess.run(cli_cmd(*args), env=env, capture_output=True, text=True, timeout=timeout)


def test_a_stage_that_swaps_its_log_for_a_fifo_does_not_hang_the_runner(hostile, tmp_path):
    """The runner never opens the FIFO (no hang); since round 28 U28-6 the stage is ERROR for what it left where a
    log goes, the FIFO moved aside (it was PASS, the FIFO left in logs/), and its rerun's log is written."""
    out = tmp_path / "out"
    r = _run(env_with(hostile, HS_P="fifolog"), "stage", "p", "--out", out, "--device", "cpu",
             "--timeout", "30", timeout=60)
    assert r.returncode == 1, r.stderr
    (p,) = manifest(out)["stages"]
    assert p["status"] == "ERROR" and "the stage left logs/p.log in the run folder as a FIFO" in p["reason"], p
    assert (out / "testrun" / "logs" / "p.log.left-by-p").is_fifo()
    r = _run(env_with(hostile, HS_P=""), "stage", "p", "--out", out, "--device", "cpu", timeout=60)
    assert r.returncode == 0, r.stderr
    (p,) = manifest(out)["stages"]
    assert p["status"] == "PASS" and (out / "testrun" / "logs" / "p.log").is_file(), p


@pytest.mark.parametrize("other", ["p.txt", "summary.md", ".manifest.lock", "junit.xml", "report.html"])
def test_a_stage_may_not_declare_another_stages_file_or_a_runner_file(hostile, cli, tmp_path, monkeypatch, other):
    out = tmp_path / "out"
    monkeypatch.setenv("HS_P", "")
    assert cli("stage", "p", "--out", out, "--device", "cpu").exit_code == 0
    run = out / "testrun"
    (run / "report.html").write_text("<p>report</p>")
    before = (run / other).read_bytes()
    monkeypatch.setenv("HS_Q", "declare")
    monkeypatch.setenv("HS_OTHER", other)
    r = cli("stage", "q", "--out", out, "--device", "cpu", "--json")
    (q,) = [s for s in json.loads(r.stdout)["stages"] if s["name"] == "q"]
    assert q["status"] == "ERROR" and other in q["reason"] and other not in q["files"], q
    cli("stage", "q", "--out", out, "--device", "cpu")  # a rerun moves q's own files only
    assert (run / other).is_file()
    assert not [p for p in (run / "history").rglob(other)]
    if other == "p.txt":
        assert (run / other).read_bytes() == before


def test_a_lone_surrogate_in_a_reason_is_recorded_and_printed_escaped(hostile, tmp_path):
    out = tmp_path / "out"
    r = _run(env_with(hostile, HS_P="surrogate", PYTHONIOENCODING="utf-8"), "stage", "p", "--out", out,
             "--device", "cpu")
    assert r.returncode == 1, r.stderr  # the stage's FAIL, not a crash
    assert "Traceback" not in r.stderr + r.stdout
    (p,) = manifest(out)["stages"]
    assert p["status"] == "FAIL" and p["reason"].startswith("bad ") and p["reason"].endswith(" text"), p
    assert "bad" in (out / "testrun" / "summary.md").read_text()
    assert "# stage p: FAIL" in (out / "testrun" / "logs" / "p.log").read_text()
