"""Bad days, red-team round 2 (issue 16): SIGHUP (a closed terminal) stops a run like SIGTERM
(recorded as interrupted); a runner killed with ``kill -9`` mid-stage leaves a manifest that never
finished: ``report`` says "runner died / unfinished" (report.html and summary.md), not "NOTHING RAN"."""

from __future__ import annotations

import signal
import subprocess

from _bad_days import cli_cmd, env_with, make, manifest, wait_for


def _start(env, out, tmp_path, spawn):
    mark = tmp_path / "x.started"
    proc = spawn(cli_cmd("oneshot", "--out", out, "--only", "x", "--device", "cpu"),
                 env=env_with(env, BD_MARK=mark, BD_SLEEP=60), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                 text=True)
    wait_for(mark, proc=proc)
    return proc


def test_sighup_stops_the_run_like_sigterm(plugins, tmp_path, spawn):
    env = make(plugins)
    out = tmp_path / "out"
    proc = _start(env, out, tmp_path, spawn)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    m = manifest(out)
    assert m["interrupted"] is True and m["finished"] and m["exit_code"] == 130


def test_a_runner_killed_mid_stage_is_reported_as_died_unfinished(plugins, cli, tmp_path, spawn):
    env = make(plugins)
    out = tmp_path / "out"
    proc = _start(env, out, tmp_path, spawn)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert manifest(out)["finished"] is None
    r = cli("report", "testrun", "--out", out)
    assert r.exit_code == 0, r.stderr
    html = (out / "testrun" / "report.html").read_text()
    assert "runner died / unfinished" in html and "NOTHING RAN" not in html
    assert "runner died / unfinished" in (out / "testrun" / "summary.md").read_text()
