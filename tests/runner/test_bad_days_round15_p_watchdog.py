"""Bad days, red-team round 15 (part A) A3: the reaper of a finished stage (``executor._Reaper``).

A3: a watchdog the stage killed was replaced only while the stage ran (``run_one``'s poll): once the
result was in, nothing checked it, and a kill -9 of the runner while the reaper held the stage left
the stage's daemon running for good. Now the reaper checks it (and starts a new one) once the tree is
frozen and while it kills it.
"""

from __future__ import annotations

import os
import uuid

try:
    from _bad_days import gone_within, wait_for
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import gone_within, wait_for

try:
    from _reaper_stages import SlowTree as _SlowTree
    from _reaper_stages import daemon, start  # noqa: F401 - daemon: a fixture
    from _reaper_stages import sleeper as _sleeper
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._reaper_stages import SlowTree as _SlowTree
    from tests.runner._reaper_stages import daemon, start  # noqa: F401 - daemon: a fixture
    from tests.runner._reaper_stages import sleeper as _sleeper

from nsa_runner import _worker, executor


def test_kill_9_of_the_runner_after_a_stage_killed_its_watchdog_leaves_nothing(plugins, tmp_path, daemon):
    """Before: b running, a's watchdog killed by a, the runner killed -9 while a's reaper gave a's
    TERM-ignoring daemon its grace: the daemon went to init and stayed (nothing watched it)."""
    started = tmp_path / "b.started"
    proc, _ = start(plugins, tmp_path, "a,b", P15_DAEMON_A=daemon, P15_KILL_WATCHDOG="a",
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
