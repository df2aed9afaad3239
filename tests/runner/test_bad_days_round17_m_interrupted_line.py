"""Bad days, red-team round 17 (part A) U-c, through the CLI: a run stopped (SIGTERM) during its closing reports,
every stage recorded, was reported "interrupted (Ctrl-C / cancel): later stages are missing" (report.html, the
``report`` command; summary.md "stages after the last one listed did not run") though none was missing.

Expected: the run notes the stages it planned; an interrupted run says which planned stages have no record, or
that every one was recorded.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

try:
    from _bad_days import MAIN, cli_cmd, env_with, make, manifest, wait_for
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, cli_cmd, env_with, make, manifest, wait_for

# SIGTERM to the runner itself as its closing reports begin (through the CLI's own handler)
_AT_REPORTS = MAIN.replace("from nsa_runner.cli import main", (
    "import os, signal; real = c.write_run_reports\n"
    "def reports(*a, **k):\n"
    "    os.kill(os.getpid(), signal.SIGTERM)\n"
    "    return real(*a, **k)\n"
    "c.write_run_reports = reports\n"
    "from nsa_runner.cli import main"))
assert _AT_REPORTS != MAIN


def test_stopped_in_the_closing_reports_says_every_stage_was_recorded(plugins, tmp_path):
    out, env = tmp_path / "out", make(plugins)
    r = subprocess.run([sys.executable, "-c", _AT_REPORTS, "oneshot", "--only", "x,y", "--out", str(out),
                        "--device", "cpu"], env=env_with(env), capture_output=True, text=True, timeout=300)
    assert r.returncode == 130, r.stdout + r.stderr
    m = manifest(out)
    assert m["interrupted"] is True and [s["status"] for s in m["stages"]] == ["PASS", "PASS"], m
    rep = subprocess.run(cli_cmd("report", "testrun", "--out", out), env=env, capture_output=True,
                         text=True, timeout=300)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    for text in (rep.stdout, (out / "testrun" / "report.html").read_text(),
                 (out / "testrun" / "summary.md").read_text()):
        assert "every planned stage has its own result" in text and "missing" not in text, text[-2000:]


def test_stopped_mid_run_names_the_planned_stages_that_did_not_run(plugins, tmp_path, spawn):
    out, mark = tmp_path / "out", tmp_path / "x.started"
    proc = spawn(cli_cmd("oneshot", "--only", "x,y,z", "--out", out, "--device", "cpu"),
                 env=env_with(make(plugins), BD_MARK=mark, BD_SLEEP=60), stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True)
    wait_for(mark, proc=proc)  # x running
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == 130
    text = (out / "testrun" / "summary.md").read_text()
    # (markdown-escaped: "2 planned stage\\(s\\)")
    assert "stopped by an interrupt: x; 2 planned stage" in text and "have no result: y, z" in text, text


def test_a_complete_run_then_an_undone_rerun_stopped_says_every_stage_has_its_result(plugins, tmp_path, spawn):
    """Round 18 A-R1 (third path): a complete oneshot, then a ``stage y`` rerun Ctrl-C'd mid-stage (its earlier
    result put back): the oneshot's reports said "only the closing steps were cut short" of a run that finished."""
    out, env = tmp_path / "out", make(plugins)
    r = subprocess.run(cli_cmd("oneshot", "--only", "x,y", "--out", out, "--device", "cpu"), env=env_with(env),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    mark = tmp_path / "y.started"
    proc = spawn(cli_cmd("stage", "y", "--out", out, "--device", "cpu"),
                 env=env_with(env, BD_MARK=mark, BD_SLEEP=60, BD_TEXT="v2"), stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True)
    wait_for(mark, proc=proc)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode == 130
    m = manifest(out)
    assert [(s["name"], s["status"], s["reason"]) for s in m["stages"]] == [("x", "PASS", "x v1"),
                                                                            ("y", "PASS", "y v1")]
    text = (out / "testrun" / "summary.md").read_text()
    assert "an nsa\\-run command into this run was stopped; every planned stage has its own result" in text, text


def test_an_interrupt_that_stops_the_last_stage_names_it(plugins, tmp_path, spawn):
    """Round 18 A-R1: SIGTERM while the last planned stage ran was "after every planned stage was recorded"."""
    out = tmp_path / "out"
    proc = spawn(cli_cmd("oneshot", "--only", "x,y", "--out", out, "--device", "cpu"),
                 env=env_with(make(plugins), BD_SLEEP_Y=60), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = out / "testrun" / "logs" / "y.log"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:  # y running (it printed), x recorded before it
        if log.exists() and "y wrote" in log.read_text(errors="replace"):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == 130
    text = (out / "testrun" / "summary.md").read_text()
    assert "stopped by an interrupt: y" in text and "every planned stage" not in text, text
