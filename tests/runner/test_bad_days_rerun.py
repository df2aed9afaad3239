"""Bad days, transactional reruns (issue 16): ``nsa-run stage X`` keeps the earlier result until the
new one is recorded. Interrupted (Ctrl-C) or with its runner killed (kill -9), the earlier files and
manifest entry are back in place (the unfinished attempt goes to ``history/``); a finished rerun
retires the earlier result to ``history/`` as before."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest
from _bad_days import cli_cmd, env_with, make, manifest, wait_for


def _first_run(env, out):
    r = subprocess.run(cli_cmd("stage", "x", "--out", out, "--device", "cpu"), env=env_with(env, BD_TEXT="v1"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (out / "testrun" / "x.txt").read_text() == "v1"


def _start_rerun(env, out, tmp_path, spawn):
    mark = tmp_path / "x2.started"
    proc = spawn(cli_cmd("stage", "x", "--out", out, "--device", "cpu"),
                 env=env_with(env, BD_TEXT="v2", BD_MARK=mark, BD_SLEEP=60), stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True)
    wait_for(mark, proc=proc)
    assert (out / "testrun" / "x.txt").read_text() == "v2"  # the attempt has overwritten the name
    spawn.snapshot()
    return proc


def _earlier_result_is_back(out):
    run = out / "testrun"
    m = manifest(out)
    (x,) = [s for s in m["stages"] if s["name"] == "x"]
    assert x["status"] == "PASS" and x["reason"] == "x v1", x
    assert (run / "x.txt").read_text() == "v1"
    assert "x wrote v1" in (run / "logs" / "x.log").read_text()
    assert not m.get("pending")
    return m


@pytest.mark.parametrize(("sig", "said"), [(signal.SIGINT, "Ctrl-C"), (signal.SIGQUIT, "SIGQUIT")])
def test_an_interrupted_rerun_puts_the_earlier_result_back(plugins, tmp_path, spawn, sig, said):
    """SIGQUIT too (Ctrl-\\, a terminal key; round 27 U27-6: its default action killed the runner, exit 131, the
    earlier result left set aside until a later command)."""
    env = make(plugins)
    out = tmp_path / "out"
    _first_run(env, out)
    proc = _start_rerun(env, out, tmp_path, spawn)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert f"interrupted ({said})" in err, err
    m = _earlier_result_is_back(out)
    (attempt,) = [h for h in m["history"] if h["name"] == "x"]
    assert attempt["status"] == "ERROR" and f"interrupted ({said})" in attempt["reason"], attempt
    assert (out / "testrun" / attempt["moved_to"] / "x.txt").read_text() == "v2"  # kept, not deleted


def test_a_rerun_whose_runner_is_killed_is_put_back_at_the_next_start(plugins, tmp_path, spawn):
    env = make(plugins)
    out = tmp_path / "out"
    _first_run(env, out)
    proc = _start_rerun(env, out, tmp_path, spawn)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    r = subprocess.run(cli_cmd("stage", "y", "--out", out, "--device", "cpu"), env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    m = _earlier_result_is_back(out)
    assert [s["name"] for s in m["stages"]] == ["x", "y"]
    assert any((out / "testrun" / "history").glob("x-*-abandoned/x.txt"))


def test_a_finished_rerun_retires_the_earlier_result_to_history(plugins, cli, tmp_path):
    make(plugins)
    out = tmp_path / "out"
    assert cli("stage", "x", "--out", out, "--device", "cpu").exit_code == 0
    r = cli("stage", "x", "--out", out, "--device", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    assert [s["name"] for s in m["stages"]] == ["x"] and not m.get("pending")
    (old,) = m["history"]
    assert (out / "testrun" / old["moved_to"] / "x.txt").is_file()
    assert (out / "testrun" / "x.txt").is_file()
