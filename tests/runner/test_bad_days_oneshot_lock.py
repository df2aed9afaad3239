"""Bad days, red-team round 2 (issue 16): a oneshot marks the stage it is running in the manifest
(as ``stage X`` does), so ``nsa-run stage X`` into the same folder meanwhile is refused (exit 2,
"already running") instead of running it a second time and overwriting the record."""

from __future__ import annotations

import signal
import subprocess

from _bad_days import cli_cmd, env_with, make, manifest, wait_for


def test_stage_x_is_refused_while_a_oneshot_runs_x_in_the_folder(plugins, tmp_path, spawn):
    env = make(plugins)
    out = tmp_path / "out"
    mark = tmp_path / "x.started"
    proc = spawn(cli_cmd("oneshot", "--out", out, "--only", "x", "--device", "cpu"),
                 env=env_with(env, BD_TEXT="oneshot", BD_MARK=mark, BD_SLEEP=60),
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(mark, proc=proc)
    r = subprocess.run(cli_cmd("stage", "x", "--out", out, "--device", "cpu"), env=env_with(env, BD_TEXT="stage"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "already running" in r.stderr
    assert (out / "testrun" / "x.txt").read_text() == "oneshot"  # the second run never started
    assert not (out / "testrun" / "history").exists()
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert not manifest(out).get("pending")
