"""Process hygiene for tests that start processes (private test helper, used by conftests).

``Spawner``: ``subprocess.Popen`` whose whole tree is killed at teardown. The tree is collected
while its root is still alive (a killed CLI would orphan its workers to init, out of reach;
``snapshot()`` records it at a moment the test knows it is complete), and each session leader's
process group is killed too (a grandchild whose parent already died is still in it).
``no_leftover_children()``: a generator for an autouse fixture that kills any child process a
test left behind (e.g. an in-process ``nsa-run`` whose executor was interrupted by the per-test
timeout: its stage worker runs in its own session).
"""

from __future__ import annotations

import os
import signal
import subprocess

try:
    import psutil
except ImportError:  # pragma: no cover - psutil is in the dev extra
    psutil = None


def _tree(pid: int) -> list:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def kill_tree(procs: list) -> None:
    """SIGKILL ``procs`` (psutil.Process) and the process groups they lead; reap what we can."""
    me = os.getpgrp()
    for p in procs:
        try:
            if os.getpgid(p.pid) == p.pid and p.pid != me:
                os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


class Spawner:
    """``spawn(cmd, **kw)`` -> Popen; ``spawn.snapshot()`` remembers the current tree of each
    process started, so a worker that outlives a dead parent can still be found and killed."""

    def __init__(self):
        self.started: list[subprocess.Popen] = []
        self.seen: dict[int, object] = {}

    def __call__(self, cmd, **kw) -> subprocess.Popen:
        proc = subprocess.Popen(cmd, **kw)
        self.started.append(proc)
        return proc

    def snapshot(self) -> None:
        if psutil is not None:
            for proc in self.started:
                self.seen.update((p.pid, p) for p in _tree(proc.pid))

    def cleanup(self) -> None:
        if psutil is not None:
            self.snapshot()
            live = [p for p in self.seen.values() if p.is_running()]  # pid reuse is checked by psutil
            if live:
                kill_tree(live)
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.communicate(timeout=10)  # reap; close pipes if any
            except (subprocess.TimeoutExpired, ValueError):
                pass


def no_leftover_children():
    if psutil is None:
        yield
        return
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    left = [p for p in me.children(recursive=True) if p.pid not in before]
    if left:
        kill_tree(left)
