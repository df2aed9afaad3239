"""Bad days, red-team round 4 (issue 16): the ``compare`` breaks, each through the CLI.

Every test here reproduces an attack that worked on the code before round 4's compare fixes (see
docs/reliability.md, "Red-team round 4"): escape sequences and HTML in a CSV key or a baseline's
figure key reaching the terminal / the markdown (t1, x_blf_key), ``--save-baseline`` onto a place
that cannot be written or a full disk ending "(unexpected)" with a temp file's name (c7, d2), an
empty ``--save-baseline`` (c8), and a hand-edited manifest listing one stage twice, whose FAIL
``compare`` never showed (v8).
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

try:  # tests/ is on sys.path under pytest's default (prepend) import mode
    from _runfolders import GPU, edit_csv
except ImportError:  # pragma: no cover - run as a package
    from tests._runfolders import GPU, edit_csv

try:  # the compare tests' fabricated run folders: ``out`` (run aaaaaaa) and ``copy`` (B, a copy of A)
    from test_compare import copy as _copy
    from test_compare import out  # noqa: F401 - a fixture
except ImportError:  # pragma: no cover
    from tests.runner.test_compare import copy as _copy
    from tests.runner.test_compare import out  # noqa: F401

HOSTILE = "\x1b[2J\x1b]8;;javascript:alert(1)\x07X\x1b]8;;\x07<script>|"


def _hostile_key(df):
    df["S"] = df["S"].astype(object)
    df.loc[df.index[0], "S"] = HOSTILE
    return df


def _no_terminal_control(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text
    assert "javascript:alert(1)" not in text or "]8;;" not in text


# ---- t1 / x_blf_key: escape sequences and HTML in compare's output ------------------------------


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_hostile_csv_key_never_reaches_terminal_or_markdown_raw(cli, out, fmt):
    b = _copy(out)
    edit_csv(b / "decode.csv", _hostile_key)
    r = cli("compare", "aaaaaaa", "bbbbbbb", "--out", out, "--all", *(["--markdown"] if fmt == "markdown" else []))
    assert r.exit_code in (0, 1), r.output
    _no_terminal_control(r.stdout + r.stderr)
    assert "X" in r.stdout  # the printable text of the key is still shown
    if fmt == "markdown":
        assert "<script>" not in r.stdout and "\\<script\\>" in r.stdout
        # every table line keeps its 8 columns: the key's | is escaped
        table = [ln for ln in r.stdout.splitlines() if ln.startswith("| ") and "\\<script\\>" in ln]
        assert table and all(ln.replace("\\|", "").count("|") == 9 for ln in table)


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_hostile_baseline_figure_key_is_plain_text(cli, out, tmp_path, fmt):
    base = tmp_path / "hostile.json"
    base.write_text(json.dumps({
        "schema_version": 1, "kind": "nsa-run-baseline", "tolerance": 0.1,
        "machines": {GPU: {"profile": "full", "figures": [
            {"file": "decode.csv", "key": {"S": HOSTILE, "B": 1}, "metric": "ms_step", "value": 1.0},
            {"file": "decode.csv", "key": {"S": 65536, "B": 1}, "metric": HOSTILE, "value": 1.0}]}}}))
    r = cli("compare", "aaaaaaa", "--out", out, "--baseline", base, "--all",
            *(["--markdown"] if fmt == "markdown" else []))
    # round 19 A U-5: a metric no timing table can have is refused when the file is read (one line, exit 2),
    # its text shown escaped ('\x1b...', as every error line shows input), never as terminal control
    assert r.exit_code == 2 and "is not a timing column" in r.stderr and r.stdout == "", r.output
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr


# ---- c7 / d2 / c8: --save-baseline where nothing can be written ---------------------------------


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_save_baseline_into_proc_is_one_line_naming_the_option(cli, out):
    r = cli("compare", "aaaaaaa", "--out", out, "--save-baseline", "/proc/self/x")
    assert r.exit_code == 2
    assert "cannot write --save-baseline /proc/self/x: No such file or directory" in r.stderr
    assert "unexpected" not in r.stderr and ".tmp" not in r.stderr and "Traceback" not in r.stderr


def test_save_baseline_on_a_full_disk_leaves_nothing(cli, out, tmp_path, monkeypatch):
    import nsa_runner.artifacts as artifacts

    def full(path, data):  # the disk fills up while the baseline's text is written (after the
        raise OSError(errno.ENOSPC, "No space left on device")  # temp file next to it was made)

    monkeypatch.setattr(artifacts, "_atomic_write_bytes", full)
    folder = tmp_path / "bl"
    folder.mkdir()
    r = cli("compare", "aaaaaaa", "--out", out, "--save-baseline", folder / "bl.json")
    monkeypatch.undo()
    assert r.exit_code == 2
    assert f"cannot write --save-baseline {folder / 'bl.json'}: No space left on device" in r.stderr
    assert "unexpected" not in r.stderr
    assert list(folder.iterdir()) == []  # no partial baseline, no temp file


def test_save_baseline_empty_path_is_refused(cli, out):
    r = cli("compare", "aaaaaaa", "--out", out, "--save-baseline", "")
    assert r.exit_code == 2
    assert "empty path" in r.output and ". exists" not in r.output


# ---- v8: one stage listed twice in a hand-edited manifest ----------------------------------------


def test_manifest_with_a_stage_listed_twice_is_refused(cli, out):
    b = _copy(out)
    m = json.loads((b / "manifest.json").read_text())
    first = m["stages"][0]
    m["stages"].append({**first, "status": "FAIL", "reason": "the hidden failure"})
    (b / "manifest.json").write_text(json.dumps(m))
    r = cli("compare", "aaaaaaa", "bbbbbbb", "--out", out)
    assert r.exit_code == 2, r.output
    assert f"stage {first['name']!r} is listed twice" in r.stderr
    assert str(b / "manifest.json") in r.stderr.replace("\n", "")
    assert "no regression" not in r.output
    r = cli("report", "bbbbbbb", "--out", out)  # the same read for every command
    assert r.exit_code == 2 and "listed twice" in r.stderr


def test_markdown_link_and_code_syntax_in_a_csv_key_stays_text(cli, out):
    """Round 23 U23-6: ``compare --markdown`` (a CI comment) escaped ``<`` ``>`` ``|`` but kept markdown link and
    code syntax, so a plugin's CSV key became a live link; summary.md escaped the same text. Now one rule."""
    b = _copy(out)

    def key(df):
        df["S"] = df["S"].astype(object)
        df.loc[df.index[0], "S"] = "[click](javascript:alert(1)) `x` ![i](http://e/i.png)"
        return df

    edit_csv(b / "decode.csv", key)
    r = cli("compare", "aaaaaaa", "bbbbbbb", "--out", out, "--all", "--markdown")
    assert r.exit_code in (0, 1), r.output
    row = [ln for ln in r.stdout.splitlines() if "click" in ln]
    assert row == [ln for ln in row if "\\[click\\]\\(javascript:alert\\(1\\)\\)" in ln and "\\`x\\`" in ln], row
    assert row and "](" not in row[0] and "`x`" not in row[0], row
