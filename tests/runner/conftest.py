"""Runner tests start real processes (the CLI, stage workers in their own sessions, their
children). Whatever a test starts dies with the test, passed, failed or timed out:

- ``spawn(cmd, **popen_kw)``: ``subprocess.Popen`` whose whole tree is killed at teardown
  (``spawn.snapshot()`` records the tree while it is complete; see tests/_procs.py);
- an autouse finaliser kills any child process a test leaves behind (e.g. an in-process
  ``nsa-run`` whose executor was interrupted by the per-test timeout).
"""

from __future__ import annotations

import pytest

try:
    from _procs import Spawner, no_leftover_children
except ImportError:  # pragma: no cover - run from the repository root
    from tests._procs import Spawner, no_leftover_children


@pytest.fixture
def spawn():
    spawner = Spawner()
    yield spawner
    spawner.cleanup()


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test():
    yield from no_leftover_children()
