"""Bad days, red-team round 25 B25-4, through the CLI: a line break in ``--out`` (``$'nl\\nx'``) split ``report``'s and
``compare``'s error over two lines ("no run 'nosuch' under nl" / "x (runs there: ...)"), while an ESC in the same place
was dropped. Expected: one error line (and its hint), the path written out as the other messages show odd input, exit 2,
nothing written."""

from __future__ import annotations

import subprocess

import pytest

try:
    from _bad_days import cli_cmd
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd


@pytest.mark.parametrize("cmd", [["report", "nosuch"], ["compare", "x", "y"]])
@pytest.mark.parametrize("odd", ["nl\nx", "nl\x1bx", "ls\u2028x"])
def test_an_odd_out_folder_keeps_the_error_on_one_line(tmp_path, cmd, odd):
    r = subprocess.run(cli_cmd(*cmd, "--out", odd), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), lines
    assert repr(odd) in lines[0], lines  # written out, never dropped or split
    assert not (tmp_path / odd).exists()
