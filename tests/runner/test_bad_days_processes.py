"""Bad days, process hygiene (issue 16): nothing a stage starts outlives it. A ``setsid``
grandchild (a daemon in a session of its own) dies when the stage PASSes and when it times out;
two Ctrl-C within the grace period stop a stage that ignores SIGTERM; ``kill -9`` of the runner
stops the running stage (parent-death signal + watchdog) and removes its temp folder; temp
folders a killed runner left are removed at the next start."""

from __future__ import annotations

import json
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from _bad_days import alive, cli_cmd, dead_pid, env_with, gone_within, make, wait_for


def test_a_setsid_grandchild_dies_when_its_stage_passes(plugins, cli, tmp_path, monkeypatch):
    make(plugins)
    pidfile = tmp_path / "daemon.pid"
    monkeypatch.setenv("BD_SETSID", str(pidfile))
    r = cli("oneshot", "--out", tmp_path / "out", "--only", "x", "--device", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    pid = int(pidfile.read_text())
    assert gone_within(pid, 5), f"setsid grandchild {pid} outlived its PASSed stage"


def test_a_setsid_grandchild_dies_when_its_stage_times_out(plugins, cli, tmp_path, monkeypatch):
    make(plugins)
    pidfile = tmp_path / "daemon.pid"
    monkeypatch.setenv("BD_SETSID", str(pidfile))
    monkeypatch.setenv("BD_SLEEP", "600")
    r = cli("oneshot", "--out", tmp_path / "out", "--only", "x", "--device", "cpu", "--timeout", "4", "--json")
    assert r.exit_code == 1, r.stderr
    assert json.loads(r.stdout)["stages"][0]["status"] == "TIMEOUT"
    pid = int(pidfile.read_text())
    assert gone_within(pid, 5), f"setsid grandchild {pid} outlived its timed-out stage"


def test_two_ctrl_c_in_the_grace_period_leave_nothing_running(plugins, tmp_path, spawn):
    env = make(plugins)
    mark = tmp_path / "x.started"
    pidfile = tmp_path / "daemon.pid"
    proc = spawn(cli_cmd("oneshot", "--out", tmp_path / "out", "--only", "x", "--device", "cpu"),
                 env=env_with(env, BD_MARK=mark, BD_SLEEP=600, BD_IGNORE_TERM=1, BD_SETSID=pidfile),
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    worker = int(wait_for(mark, proc=proc))
    daemon = int(wait_for(pidfile))
    spawn.snapshot()
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)  # inside the 3 s grace period: the stage ignores the SIGTERM it got
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert gone_within(worker, 5) and gone_within(daemon, 5)


def test_kill_9_of_the_runner_stops_the_stage_and_removes_its_temp_folder(plugins, tmp_path, spawn):
    env = make(plugins)
    mark = tmp_path / "x.started"
    pidfile = tmp_path / "daemon.pid"
    proc = spawn(cli_cmd("oneshot", "--out", tmp_path / "out", "--only", "x", "--device", "cpu"),
                 env=env_with(env, BD_MARK=mark, BD_SLEEP=600, BD_SETSID=pidfile),
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = int(wait_for(mark, proc=proc))
    daemon = int(wait_for(pidfile))
    temps = list(Path(tempfile.gettempdir()).glob(f"nsa-run-x-{proc.pid}-*"))
    assert len(temps) == 1 and (temps[0] / "job.pkl").is_file()
    spawn.snapshot()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert gone_within(worker, 10), "the stage outlived its runner"
    assert gone_within(daemon, 10), "the stage's setsid grandchild outlived the runner"
    deadline = time.monotonic() + 10
    while temps[0].exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not temps[0].exists(), "the dead runner's stage temp folder was left behind"


def test_stale_temp_folders_of_a_dead_runner_are_removed_at_the_next_start(plugins, cli, tmp_path):
    make(plugins)
    pid = dead_pid()
    assert not alive(pid)
    stale = Path(tempfile.mkdtemp(prefix=f"nsa-run-x-{pid}-"))
    (stale / "job.pkl").write_bytes(b"left by a killed runner")
    (stale / ".nsa-run-owned").write_text(f"{pid}\n")  # the marker nsa-run writes into what it makes
    out = tmp_path / "out"
    incoming = out / f".incoming-testrun-{pid}-abcd1234"
    incoming.mkdir(parents=True)
    (incoming / ".nsa-run-owned").write_text(f"{pid}\n")
    live = Path(tempfile.mkdtemp(prefix=f"nsa-run-x-{__import__('os').getpid()}-"))  # a live runner's: kept
    # red-team round 2 (p19): a user's folders whose names merely look like nsa-run's are never removed
    mine = [Path(tempfile.gettempdir()) / f"nsa-run-results-{pid}-final", out / f".incoming-notes-{pid}-x",
            Path(tempfile.mkdtemp(prefix=f"nsa-run-y-{pid}-"))]  # the right name, no marker
    for d in mine:
        d.mkdir(parents=True, exist_ok=True)
        (d / "data.txt").write_text("precious")
    try:
        r = cli("oneshot", "--out", out, "--only", "x", "--device", "cpu")
        assert r.exit_code == 0, r.stderr
        assert not stale.exists() and not incoming.exists()
        assert live.exists()
        assert all((d / "data.txt").read_text() == "precious" for d in mine)
        assert not list((out / "testrun").glob(".nsa-run-owned"))
    finally:
        import shutil

        for d in [live, stale, *mine]:
            shutil.rmtree(d, ignore_errors=True)
