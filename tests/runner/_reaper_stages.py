"""Shared by the round-15 reaper tests (A3, A5): plugin stages a / b that write their file, may start a
TERM-ignoring daemon (env cleared, a session of its own) or kill their own watchdog, and note when they
started; the ``daemon`` fixture (its pid file; never left running) and ``start`` (a oneshot of them)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

try:
    from _bad_days import MAIN, alive, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, alive, env_with

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


def start(plugins, tmp_path, only: str, **env) -> tuple[subprocess.Popen, object]:
    plugins.make("p15r-plugin", "p15r_mod", STAGES, {"a": "p15r_mod:A", "b": "p15r_mod:B"})
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", MAIN, "oneshot", "--only", only, "--out", out, "--device", "cpu"],
                            env=env_with(plugins.env(), **env), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, out / "testrun" / "manifest.json"


class SlowTree:
    """A stage tree whose kill takes until ``release`` is set (as a worker freeing its CUDA context)."""

    def __init__(self, log: list[str], stage: subprocess.Popen):
        self.release = threading.Event()
        self.log, self.stage = log, stage

    def kill(self, grace_s, term=True):
        self.release.wait(30)
        self.stage.kill()
        self.log.append("killed")


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
