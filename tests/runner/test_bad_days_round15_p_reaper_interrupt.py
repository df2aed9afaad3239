"""Bad days, red-team round 15 (part A) A5: the reaper of a finished stage (``executor._Reaper``).

A5: an interrupt (one SIGTERM, a double Ctrl-C) while the runner waited for the last stage's reaper:
``Thread.join`` interrupted by a signal handler marks the thread stopped (CPython 3.11, bpo-45274), so
nothing waited for it any more and nsa-run exited 130 with the finished stage's helper still alive
(a TERM-ignoring daemon, env cleared, ``setsid``). Now the runner waits on an Event the reaper sets at
its very end, again after an interrupt, on every way out.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid

import pytest

try:
    from _bad_days import alive
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import alive

try:
    from _reaper_stages import SlowTree as _SlowTree
    from _reaper_stages import daemon, start  # noqa: F401 - daemon: a fixture
    from _reaper_stages import sleeper as _sleeper
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._reaper_stages import SlowTree as _SlowTree
    from tests.runner._reaper_stages import daemon, start  # noqa: F401 - daemon: a fixture
    from tests.runner._reaper_stages import sleeper as _sleeper

from nsa_runner import executor


def _finished(manifest, proc) -> None:
    """Until the run's manifest says it finished (before the fix: then the runner waited for the last
    stage's reaper, in its 3 s grace) or nsa-run ended."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if json.loads(manifest.read_text()).get("finished"):
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    assert proc.poll() is not None, "the run never finished"


def test_sigterm_while_the_last_stages_tree_is_killed_waits_for_it(plugins, tmp_path, daemon):
    """Before: exit 130 at once, a's daemon still alive (running, then stopped) when nsa-run had exited.
    (Now the manifest is finished once the reapers are done; the interrupted wait itself is the unit
    test below.)"""
    proc, manifest = start(plugins, tmp_path, "a", P15_DAEMON_A=daemon)
    try:
        _finished(manifest, proc)  # a's result is in (before the fix: its tree was still being killed)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=120)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    pid = int(daemon.read_text())
    assert not alive(pid), f"a's daemon {pid} outlived nsa-run (rc {proc.returncode}): {out[-2000:]}"
    assert proc.returncode in (0, 130), out
    assert json.loads(manifest.read_text())["stages"][0]["status"] == "PASS"


def test_reaper_join_interrupted_still_waits_for_the_kill(monkeypatch):
    """The runner's wait for a reaper, interrupted (the CLI's handlers raise KeyboardInterrupt), goes on
    until the reaper's kill is done, then raises. Before: ``join`` raised at once, the kill unfinished."""
    log: list[str] = []
    stage = _sleeper()
    tree = _SlowTree(log, stage)
    monkeypatch.setattr(executor, "freeze_processes", lambda cookie, root: tree)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        reaper = executor._Reaper(stage, uuid.uuid4().hex, None)

        def later():
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGUSR1)  # the interrupt lands while join waits
            time.sleep(0.5)
            log.append("released")
            tree.release.set()

        t = threading.Thread(target=later)
        t.start()
        with pytest.raises(KeyboardInterrupt):
            executor._join_all([reaper])
        log.append("joined")
        t.join()
    finally:
        signal.signal(signal.SIGUSR1, previous)
        tree.release.set()
        stage.kill()
        stage.wait()
    assert log == ["released", "killed", "joined"], log
