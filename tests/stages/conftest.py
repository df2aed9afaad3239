"""Stage tests that run the CLI in-process start stage workers (own sessions): any child process
a test leaves behind is killed when it ends (tests/_procs.py)."""

from __future__ import annotations

import pytest

try:
    from _procs import no_leftover_children
except ImportError:  # pragma: no cover - run from the repository root
    from tests._procs import no_leftover_children


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test():
    yield from no_leftover_children()
