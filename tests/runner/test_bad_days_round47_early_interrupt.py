"""Bad days, red-team round 47 B47a-1, through the nsa-run script: a Ctrl-C in nsa-run's first moments.

The script's first signal handlers (one "interrupted" line, exit 130) were installed at ``nsa_runner/cli.py``'s first
line, but ``from nsa_runner.cli import main`` first runs ``nsa_runner/__init__.py``, which imports ``nsa_runner.stage``
(enum, dataclasses: 20 ms idle, 120-270 ms on a loaded machine). A Ctrl-C there printed a KeyboardInterrupt traceback,
a TERM / HUP exited 143 / 129 (4 and 10 of 60 tries in round 47). The window is made certain here: the signal is
raised as ``nsa_runner.stage`` begins to load (an import hook of the test's script, named like the real one).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import _signal, importlib.abc, sys

class _SignalAtStage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == {at!r}:
            sys.meta_path.remove(self)
            _signal.raise_signal(_signal.{sig})
        return None

sys.meta_path.insert(0, _SignalAtStage())
from nsa_runner.cli import main
sys.exit(main())
"""


@pytest.mark.parametrize("at", ["nsa_runner.stage", "signal"])
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_as_the_package_loads_gives_the_one_line_and_130(tmp_path, sig, at):
    """``at``: the module whose loading the signal meets. Round 48 B48a-3: the early handlers' own ``import signal``
    (its enums built before any handler was set) was a window of its own; they are set through ``_signal`` now."""
    script = tmp_path / "nsa-run"  # the real script's name: the early handlers are the script's only
    script.write_text(SCRIPT.format(sig=sig, at=at))
    r = subprocess.run([sys.executable, str(script), "list"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    how = "Ctrl-C" if sig == "SIGINT" else sig
    # before: a KeyboardInterrupt traceback (SIGINT), rc -15 / -1 (TERM / HUP: the default action)
    assert r.returncode == 130, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip() == f"interrupted ({how}): nsa-run stopped; nothing is left running", r.stderr
    assert signal.Signals[sig]  # (the names used are real signals)
