"""Bad days, red-team round 15 (part A) A3: the reaper of a finished stage (``executor._Reaper``).

A3: a watchdog the stage killed was replaced only while the stage ran (``run_one``'s poll): once the
result was in, nothing checked it, and a kill -9 of the runner while the reaper held the stage left
the stage's daemon running for good. Now the reaper checks it (and starts a new one) once the tree is
frozen and while it kills it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid

import pytest

try:
    from _bad_days import MAIN, alive, env_with, gone_within, wait_for
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, alive, env_with, gone_within, wait_for

from nsa_runner import _worker, executor

STAGES = """
import os, signal, subprocess, sys, time
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

DAEMON = '''
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
os.setsid()
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(1000)
'''

def _kill_watchdog():
    cookie = os.environ["NSA_RUN_STAGE_COOKIE"].encode()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
            except OSError:
                continue
            if b"--watchdog" in cmd and cookie in cmd:
                os.kill(int(pid), signal.SIGKILL)
                return int(pid)
    raise RuntimeError("no watchdog found")

def _act(ctx, name):
    (ctx.dir / f"{name}.txt").write_text(name)
    pidfile = os.environ.get("P15_DAEMON_" + name.upper())
    if pidfile:  # a TERM-ignoring daemon: env cleared, a session of its own
        subprocess.Popen([sys.executable, "-c", DAEMON, pidfile], env={"PATH": "/usr/bin:/bin"},
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not os.path.exists(pidfile):
            time.sleep(0.01)
    if os.environ.get("P15_KILL_WATCHDOG") == name:
        Path(os.environ["P15_WATCHDOG"]).write_text(str(_kill_watchdog()))
    started = os.environ.get("P15_STARTED_" + name.upper())
    if started:
        Path(started).write_text(str(os.getpid()))
    time.sleep(float(os.environ.get("P15_SLEEP_" + name.upper(), "0")))
    return StageResult(Status.PASS, name, files=[f"{name}.txt"])

class A(Stage):
    name, order, timeout_s = "a", 10, 120.0
    def run(self, ctx):
        return _act(ctx, "a")

class B(Stage):
    name, order, timeout_s = "b", 11, 120.0
    def run(self, ctx):
        return _act(ctx, "b")
"""


@pytest.fixture
def daemon(tmp_path):
    """The daemon's pid file; a daemon still alive at the end is killed (never left behind)."""
    pidfile = tmp_path / "daemon.pid"
    yield pidfile
    if pidfile.is_file() and pidfile.read_text().strip() and alive(int(pidfile.read_text())):
        os.kill(int(pidfile.read_text()), signal.SIGKILL)


def _start(plugins, tmp_path, only: str, **env) -> tuple[subprocess.Popen, object]:
    plugins.make("p15r-plugin", "p15r_mod", STAGES, {"a": "p15r_mod:A", "b": "p15r_mod:B"})
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", MAIN, "oneshot", "--only", only, "--out", out, "--device", "cpu"],
                            env=env_with(plugins.env(), **env), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, out / "testrun" / "manifest.json"


class _SlowTree:
    """A stage tree whose kill takes until ``release`` is set (as a worker freeing its CUDA context)."""

    def __init__(self, log: list[str], stage: subprocess.Popen):
        self.release = threading.Event()
        self.log, self.stage = log, stage

    def kill(self, grace_s, term=True):
        self.release.wait(30)
        self.stage.kill()
        self.log.append("killed")


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)


def test_kill_9_of_the_runner_after_a_stage_killed_its_watchdog_leaves_nothing(plugins, tmp_path, daemon):
    """Before: b running, a's watchdog killed by a, the runner killed -9 while a's reaper gave a's
    TERM-ignoring daemon its grace: the daemon went to init and stayed (nothing watched it)."""
    started = tmp_path / "b.started"
    proc, _ = _start(plugins, tmp_path, "a,b", P15_DAEMON_A=daemon, P15_KILL_WATCHDOG="a",
                     P15_WATCHDOG=tmp_path / "watchdog.pid", P15_STARTED_B=started, P15_SLEEP_B=60,
                     NSA_RUN_SPARE_WORKER="0")
    try:
        b = int(wait_for(started, proc=proc))
    finally:
        proc.kill()
        proc.wait()
    pid = int(daemon.read_text())
    assert gone_within(b, 30.0), "b outlived the runner (its own watchdog)"
    assert gone_within(pid, 30.0), f"a's daemon {pid} outlived the runner killed -9"


def test_reaper_replaces_a_watchdog_the_stage_killed(monkeypatch):
    """Once the stage is frozen, its watchdog is checked: a dead one (the stage SIGKILLed it before its
    result) is replaced while the reaper still holds the stage. Before: never (only run_one's poll)."""
    log: list[str] = []
    stage = _sleeper()
    tree = _SlowTree(log, stage)
    monkeypatch.setattr(executor, "freeze_processes", lambda cookie, root: tree)
    cookie = uuid.uuid4().hex
    guard = _worker.Watchdog(cookie, stage.pid, "/nonexistent-p15", dict(os.environ))
    first = guard.proc
    try:
        first.kill()
        first.wait()
        reaper = executor._Reaper(stage, cookie, guard)
        assert guard.proc is not None and guard.proc is not first and guard.proc.poll() is None
        tree.release.set()
        reaper.join()
    finally:
        tree.release.set()
        stage.kill()
        stage.wait()
        guard.done()
    assert log == ["killed"]
