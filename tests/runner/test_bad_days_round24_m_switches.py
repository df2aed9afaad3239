"""Bad days, red-team round 24 B24-6, through the CLI: NSA_RUN_PYCACHE turned the bytecode cache off only for ``0``
(``off`` / ``false`` / ``no`` left it on, writing .pyc files under the user's cache; ``maybe`` was not refused), and
NSA_RUN_DEBUG=off turned debug on (round 14 U4, fixed then for NSA_RUN_SPARE_WORKER only). Expected: one on / off
rule for every switch (1/true/yes/on, 0/false/no/off, any case); anything else refused in one line, exit 2."""

from __future__ import annotations

import subprocess
import sys

try:
    from _bad_days import MAIN, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with


def _nsa_run(env, *args):
    return subprocess.run([sys.executable, "-c", MAIN, *args], env=env, capture_output=True, text=True, timeout=300)


def test_the_bytecode_switch_reads_off_as_off_and_refuses_other_words(plugins, tmp_path):
    for word in ("off", "False", "NO", "0"):
        home = tmp_path / f"home-{word}"
        home.mkdir()
        env = env_with(plugins.env(), NSA_RUN_PYCACHE=word, HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"),
                       PYTHONDONTWRITEBYTECODE="1")
        r = _nsa_run(env, "list")
        assert r.returncode in (0, 1), (word, r.stderr[-2000:])
        assert not list(home.rglob("*.pyc")), word  # off: no bytecode cache written
    r = _nsa_run(env_with(plugins.env(), NSA_RUN_PYCACHE="maybe"), "list")
    assert r.returncode == 2 and "NSA_RUN_PYCACHE='maybe' is not one of" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_the_debug_switch_reads_off_as_off_and_refuses_other_words(plugins, tmp_path):
    r = _nsa_run(env_with(plugins.env(), NSA_RUN_DEBUG="off"), "report", str(tmp_path / "nothing"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    r = _nsa_run(env_with(plugins.env(), NSA_RUN_DEBUG="maybe"), "list")
    assert r.returncode == 2 and "NSA_RUN_DEBUG='maybe' is not one of" in r.stderr, r.stderr[-2000:]
