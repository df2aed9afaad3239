"""Bad days, red-team round 16 (part A) A1 and A2: the watchdog that cleans up after a kill -9 of the runner.

A1: the watchdog learned of the runner's death only from EOF on its pipe. A stage (or a plugin's import
during discovery) reopened the runner's end of that pipe through ``/proc/<runner>/fd/N`` and handed it
to a child of its own session: after a kill -9 of the runner the watchdog never woke, and the child and
the watchdog lived on (reparented to init). Now the watchdog watches the runner itself (a pidfd of it).

A2: a stage killed its watchdog just before returning; the runner, freezing the finished stage (SIGSTOP)
before it reads the result, was killed -9 meanwhile: the stage's daemon (environment cleared, a session
of its own) was left stopped under init for good. Now the watchdog is replaced before the freeze and
told of each process the runner stops, before it stops it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN, alive, env_with, gone_within, wait_for
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, alive, env_with, gone_within, wait_for

SOURCE = """
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

def _watchdog():
    cookie = os.environ["NSA_RUN_STAGE_COOKIE"].encode()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
            except OSError:
                continue
            if b"--watchdog" in cmd and cookie in cmd:
                return int(pid), cmd[cmd.index(b"--watchdog") + 1].decode()
    raise RuntimeError("no watchdog found")

def _hold_pipe(pidfile):
    # the runner's end of the watchdog's pipe, reopened through /proc/<runner>/fd/N, kept by a child
    # in a session of its own
    wd, rfd = _watchdog()
    runner = int(open(f"/proc/{wd}/stat").read().rpartition(")")[2].split()[1])
    pipe = os.readlink(f"/proc/{wd}/fd/{rfd}")
    w = None
    for fd in os.listdir(f"/proc/{runner}/fd"):
        try:
            if os.readlink(f"/proc/{runner}/fd/{fd}") == pipe:
                w = os.open(f"/proc/{runner}/fd/{fd}", os.O_WRONLY)
        except OSError:
            pass
    assert w is not None, "the runner's end of the pipe was not found"
    child = subprocess.Popen(["sleep", "300"], pass_fds=[w], start_new_session=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(w)
    Path(pidfile + ".tmp").write_text(f"{child.pid} {wd}")
    os.rename(pidfile + ".tmp", pidfile)
    time.sleep(120)

if os.environ.get("J16_IMPORT_HOLD"):  # during discovery (``nsa-run list``): the plugin's import
    _hold_pipe(os.environ["J16_IMPORT_HOLD"])

def _act(ctx, name):
    if os.environ.get("J16_HOLD"):
        _hold_pipe(os.environ["J16_HOLD"])
    (ctx.dir / f"{name}.txt").write_text(name)
    pidfile = os.environ.get("J16_DAEMON")
    if pidfile:  # a TERM-ignoring daemon (env cleared, a session of its own); the watchdog killed last
        subprocess.Popen([sys.executable, "-c", DAEMON, pidfile], env={"PATH": "/usr/bin:/bin"},
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not os.path.exists(pidfile):
            time.sleep(0.01)
        os.kill(_watchdog()[0], signal.SIGKILL)
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
def leftovers():
    """Pids the test must never leave running (killed at the end if they are)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def _cli(plugins, tmp_path, *args, **env) -> subprocess.Popen:
    plugins.make("j16-plugin", "j16_mod", SOURCE, {"a": "j16_mod:A", "b": "j16_mod:B"})
    return subprocess.Popen([sys.executable, "-c", MAIN, *map(str, args)],
                            env=env_with(plugins.env(), NSA_RUN_SPARE_WORKER="0", **env),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _kill_runner_holding_the_pipe(proc: subprocess.Popen, pidfile, leftovers: list[int]) -> None:
    try:
        child, wd = map(int, wait_for(pidfile, proc=proc).split())
        leftovers += [child, wd]
    finally:
        proc.kill()  # kill -9 of the runner
        proc.wait()
    assert gone_within(child, 30.0), "the child holding the watchdog's pipe outlived the runner killed -9"
    assert gone_within(wd, 30.0), "the watchdog outlived the runner killed -9"


def test_a_stage_holding_the_watchdogs_pipe_does_not_outlive_the_runner(plugins, tmp_path, leftovers):
    """Before: after the kill -9 the watchdog waited for an EOF that never came; the stage's child lived."""
    pidfile = tmp_path / "held.pids"
    proc = _cli(plugins, tmp_path, "oneshot", "--only", "a", "--out", tmp_path / "out", "--device", "cpu",
                J16_HOLD=pidfile)
    _kill_runner_holding_the_pipe(proc, pidfile, leftovers)


def test_a_plugin_import_holding_the_watchdogs_pipe_does_not_outlive_list(plugins, tmp_path, leftovers):
    """The same from a plugin's import in ``nsa-run list`` (the discovery process's watchdog)."""
    pidfile = tmp_path / "held.pids"
    proc = _cli(plugins, tmp_path, "list", J16_IMPORT_HOLD=pidfile)
    _kill_runner_holding_the_pipe(proc, pidfile, leftovers)


def test_kill_9_while_the_runner_freezes_a_stage_that_killed_its_watchdog(plugins, tmp_path, leftovers):
    """Stage a starts a daemon and kills its watchdog as it returns; the runner is killed -9 the moment
    its freeze has stopped the daemon. Before: the daemon stayed stopped (T) under init for good."""
    pidfile = tmp_path / "daemon.pid"
    proc = _cli(plugins, tmp_path, "oneshot", "--only", "a,b", "--out", tmp_path / "out", "--device", "cpu",
                J16_DAEMON=pidfile)
    try:
        daemon = int(wait_for(pidfile, proc=proc))
        leftovers.append(daemon)
        state = ""
        while state not in ("T", "Z", "X", "gone"):  # the freeze reaches it (a few ms to seconds)
            try:
                with open(f"/proc/{daemon}/stat", "rb") as f:
                    state = f.read().rpartition(b")")[2].split()[0].decode()
            except OSError:
                state = "gone"
            if proc.poll() is not None:
                break
    finally:
        proc.kill()  # kill -9 of the runner
        proc.wait()
    assert state == "T", f"the daemon was never seen stopped by the freeze (state {state!r})"
    assert gone_within(daemon, 30.0), f"the stage's daemon {daemon} outlived the runner killed -9 (stopped)"
