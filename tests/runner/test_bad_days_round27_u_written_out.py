"""Bad days, red-team round 27's unclear item: the error for an ``--out`` that lies under no folder printed the path
with its ESC dropped (``--out $'f\\x1bx/sub'`` where ``f<ESC>x`` is a FIFO: "fx is a FIFO, not a folder", a name
that is not the one given, as round 19 A19-R2 found for the run-folder line). Expected: every ``error:`` line writes
each control character out (``\\x1b``), never drops it; one line and a hint, exit 2, nothing made there."""

from __future__ import annotations

import os
import subprocess

import pytest

try:
    from _bad_days import cli_cmd
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd


@pytest.mark.parametrize("cmd", [["oneshot", "--only", "env-pairing"], ["stage", "env-pairing"]])
@pytest.mark.parametrize("kind", ["fifo", "file"])
def test_an_error_line_writes_control_characters_out(tmp_path, cmd, kind):
    odd = tmp_path / "f\x1bx"
    if kind == "fifo":
        os.mkfifo(odd)
    else:
        odd.write_text("a file")
    r = subprocess.run(cli_cmd(*cmd, "--out", str(odd / "sub")), cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), lines
    assert "f\\x1bx" in lines[0] and "not a folder" in lines[0] and "\x1b" not in r.stderr, lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f\x1bx"]
