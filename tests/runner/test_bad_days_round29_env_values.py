"""Bad days, red-team round 29 B29-4, through the CLI: an ``NSA_RUN_*`` value's leading or trailing control characters
were dropped from its error line (the value was stripped before it was quoted: ``NSA_RUN_LOCK_TIMEOUT=$'abc\\x1c'``
shown ``'abc'``), and a value of control characters only was taken as blank, the default used without a word.
Expected: the value as given, written out, one line and a hint, exit 2; nothing run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with



@pytest.mark.parametrize(("name", "value"), [
    ("NSA_RUN_LOCK_TIMEOUT", "abc\x1c"), ("NSA_RUN_LOCK_TIMEOUT", "\tabc\r"), ("NSA_RUN_LOCK_TIMEOUT", "\x1c"),
    ("NSA_RUN_PYCACHE", "\x1b[31m\n"), ("NSA_RUN_PARITY_JOBS", "x\x1f"),
    # round 30 U30-2: Unicode digits and "_" were taken as a number of seconds (Python's float)
    ("NSA_RUN_LOCK_TIMEOUT", "\u0661\u0662"), ("NSA_RUN_DISCOVERY_TIMEOUT", "1_0"),
    ("NSA_RUN_ADAPTER_PROCESS", "maybe"),  # (stop 41's switch: refused as the others are)
])
def test_an_env_value_is_named_as_given(tmp_path, name, value):
    out = tmp_path / "o"
    r = subprocess.run([sys.executable, "-c", MAIN, "stage", "summary", "--out", str(out), "--device", "cpu"],
                       env=env_with(dict(os.environ), **{name: value}), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])  # before: '\x1c' alone ran with the default
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: "), lines
    assert f"{name}={value!r}" in lines[0], lines  # before: the stripped value
    assert not out.exists() or not any(out.iterdir())
