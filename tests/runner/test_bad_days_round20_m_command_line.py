"""Bad days, red-team round 20 (part A) U-2 and U-3, through the CLI.

U-2: summary.md's and report.html's "command" line dropped the control characters of a recorded argument (``--out
$'runs\\x1b[0m'`` read ``--out runs``): the files named ANOTHER folder, while the terminal (round 19 A19-R2) shows
it escaped. Expected: each word as the terminal shows it, ``'runs\\x1b[0m'``.
U-3: ``"schema_version": true`` (and ``1.0``) in manifest.json was read as schema 1 (``True == 1`` in Python).
Expected: refused in one line naming it, exit 2, like any other unsupported version.
"""

from __future__ import annotations

import html
import json
import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN


def _run(env, *args, cwd=None):
    return subprocess.run([sys.executable, "-c", MAIN, *map(str, args)], env=env, cwd=cwd, text=True,
                          capture_output=True, timeout=600)


def test_the_files_command_line_shows_an_odd_out_word_escaped(plugins, tmp_path):
    env = plugins.env()
    r = _run(env, "oneshot", "--only", "summary", "--out", "runs\x1b[0m", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    run = tmp_path / "runs\x1b[0m" / "testrun"
    command = next(ln for ln in (run / "summary.md").read_text().splitlines() if ln.startswith("- command:"))
    # before: "- command: ... --out runs" (the ESC sequence dropped): another folder's name
    assert "x1b" in command and "\x1b" not in command, command
    page = html.unescape((run / "report.html").read_text())
    assert "'runs\\x1b[0m'" in page  # before: "--out runs"


def test_the_files_command_line_quotes_a_word_with_a_space(plugins, tmp_path):
    """Round 21 unclear U-1: ``--out "my runs"`` read ``--out my runs`` (two words) in the files' command line."""
    env = plugins.env()
    r = _run(env, "oneshot", "--only", "summary", "--out", "my runs", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    run = tmp_path / "my runs" / "testrun"
    command = next(ln for ln in (run / "summary.md").read_text().splitlines() if ln.startswith("- command:"))
    assert "\\-\\-out 'my runs'" in command or "--out 'my runs'" in command, command
    page = html.unescape((run / "report.html").read_text())
    assert "--out 'my runs'" in page, page[:2000]


@pytest.mark.parametrize("version", [True, 1.0])
def test_a_schema_version_that_only_equals_1_is_refused(plugins, tmp_path, version):
    env = plugins.env()
    r = _run(env, "oneshot", "--only", "summary", "--out", tmp_path / "o")
    assert r.returncode == 0, r.stderr[-2000:]
    path = tmp_path / "o" / "testrun" / "manifest.json"
    m = json.loads(path.read_text())
    m["schema_version"] = version
    path.write_text(json.dumps(m))
    (path.parent / ".manifest.json.good").write_text(json.dumps(m))
    r = _run(env, "report", path.parent)
    assert r.returncode == 2, (r.returncode, r.stdout[-1000:], r.stderr[-1000:])  # before: 0, read as schema 1
    assert "schema_version" in r.stderr and "Traceback" not in r.stderr
