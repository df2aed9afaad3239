"""Bad days, red-team round 17 (part A) A-R1, through the CLI: a ``stage X`` into the folder of a oneshot whose
runner was killed (kill -9) mid-run wiped the "runner died / unfinished" fact: the stage command's finish set
``finished`` (and exit code 0), so summary.md, report.html and ``report`` showed a complete, green oneshot whose
later stages never ran. (A Ctrl-C'd oneshot kept its "interrupted" line after such a rerun.)

Expected: the dead run's line is noted in the manifest when a later command opens the run, and stays.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

from _bad_days import cli_cmd, env_with, make, manifest, wait_for


def test_a_rerun_into_a_killed_oneshots_run_keeps_runner_died(plugins, cli, tmp_path, spawn):
    env = make(plugins)
    out = tmp_path / "out"
    mark = tmp_path / "y.started"
    proc = spawn(cli_cmd("oneshot", "--out", out, "--only", "x,y,z", "--device", "cpu"),
                 env=env_with(env, BD_MARK=mark, BD_SLEEP_Y=60), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                 text=True)
    wait_for(mark, proc=proc)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:  # x recorded, y running, z not started
        try:
            m = manifest(out)
        except (OSError, ValueError):
            m = {}
        if [s["name"] for s in m.get("stages", [])] == ["x"] and any(
                p.get("stage") == "y" for p in m.get("pending") or []):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    r = cli("report", "testrun", "--out", out)
    assert "runner died / unfinished" in r.stdout, r.stdout
    rerun = subprocess.run(cli_cmd("stage", "y", "--out", out, "--device", "cpu"), env=env_with(env, BD_SLEEP_Y=0),
                           capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    m = manifest(out)
    assert [s["name"] for s in m["stages"]] == ["x", "y"]
    r = cli("report", "testrun", "--out", out)
    assert r.exit_code == 0, r.stderr
    assert "runner died / unfinished" in r.stdout, r.stdout  # before: "2 passed, 0 failed" and nothing else
    assert "runner died / unfinished" in (out / "testrun" / "summary.md").read_text()
    assert "runner died / unfinished" in (out / "testrun" / "report.html").read_text()
    assert json.loads((out / "testrun" / "summary.json").read_text()).get("runner_died"), "summary.json"
    # what the run lacks is said from its records each time (round 18 A-R2: "stages after the last one listed did
    # not run" stayed, named nothing, and was said of a run that lacked none)
    assert "1 planned stage(s) have no result: z" in r.stdout, r.stdout
    rerun = subprocess.run(cli_cmd("stage", "z", "--out", out, "--device", "cpu"), env=env_with(env),
                           capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    r = cli("report", "testrun", "--out", out)
    assert "runner died / unfinished" in r.stdout and "every planned stage has its own result" in r.stdout, r.stdout
