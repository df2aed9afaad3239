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
        assert "after every planned stage was recorded" in text and "missing" not in text, text[-2000:]


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
    assert "did not run: y, z" in text, text  # "2 planned stage\\(s\\)": markdown-escaped
