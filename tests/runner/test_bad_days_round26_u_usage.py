"""Bad days, red-team round 26 U26-4, through the CLI: the command-line parser's own errors (an unknown option, a bad
``--timeout``, an extra argument, an option without its value) were typer's box of 5-6 lines, not nsa-run's one line
naming the problem. Expected: ``error: ...`` on one line, its control characters written out, then a hint; exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN


@pytest.mark.parametrize(("args", "said"), [
    (["stage", "selection-map", "--timeout", "abc"], "Invalid value for '--timeout'"),
    (["list", "--bogus"], "No such option: --bogus"),
    (["list", "a", "b"], "unexpected extra argument"),
    (["oneshot", "--profile"], "requires an argument"),
    (["list", "--x\x1b[31mred"], "No such option: --x\\x1b[31mred"),
])
def test_a_usage_error_is_one_line_and_a_hint(tmp_path, args, said):
    r = subprocess.run([sys.executable, "-c", MAIN, *args], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and said in lines[0], lines
    assert lines[1].startswith("hint: ") and "\x1b" not in r.stderr, lines


def test_nsa_run_alone_shows_the_help_and_no_empty_error(tmp_path):
    """Round 27 B27-7: after the one-line rule, `nsa-run` alone printed the help, then an empty ``error: `` line."""
    r = subprocess.run([sys.executable, "-c", MAIN], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert "Usage:" in r.stdout + r.stderr and "oneshot" in r.stdout + r.stderr, (r.stdout, r.stderr)
    assert "error:" not in r.stderr, r.stderr
