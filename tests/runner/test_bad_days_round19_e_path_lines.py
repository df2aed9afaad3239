"""Bad days, red-team round 19 part A, Root A19-R2 (/tmp/rt19a/report.md): a control character in the
``--out`` / run path was DROPPED in the terminal's ``nsa-run run ID -> PATH``, ``artifacts: PATH`` and
``report: PATH`` lines (the console's control stripping, ``_ui.plain_text``), so ``--out $'runs\\x1b[0m'``
beside an existing ``runs/`` run printed ``.../runs/testrun``: the OTHER run's folder. A newline was
printed raw (the line split). Root: paths went through the text rule for plugin text (strip) instead of
the rule for user input (``shown``: made visible). Now every printed path goes through ``_ui.path_shown``:
as it is when printable (copy-pasteable), else its repr (``'.../runs\\x1b[0m/testrun'``), never dropped.

Through the CLI: ``oneshot``, ``stage`` (a rerun) and ``report`` into such folders."""

from __future__ import annotations

import subprocess

try:  # tests/ is on sys.path under pytest's default (prepend) import mode
    from _bad_days import cli_cmd, env_with, make
except ImportError:  # pragma: no cover - run as a package
    from tests._bad_days import cli_cmd, env_with, make


def _nsa(tmp_path, env, *args, text="v1"):
    return subprocess.run(cli_cmd(*args), cwd=tmp_path, env=env_with(env, BD_TEXT=text, COLUMNS=2000),
                          text=True, capture_output=True, timeout=180)


def _lines(text: str, start: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(start)]


def test_an_escape_in_the_out_path_is_shown_not_dropped(plugins, tmp_path):
    env = make(plugins)
    other = _nsa(tmp_path, env, "oneshot", "--device", "cpu", "--only", "x", "--out", "runs", text="OTHER")
    assert other.returncode == 0, other.stderr[-2000:]
    odd = "runs\x1b[0m"
    r = _nsa(tmp_path, env, "oneshot", "--device", "cpu", "--only", "x", "--out", odd, text="MINE")
    assert r.returncode == 0, r.stderr[-2000:]
    mine = tmp_path / odd / "testrun"
    assert (mine / "x.txt").read_text() == "MINE" and (tmp_path / "runs/testrun/x.txt").read_text() == "OTHER"
    want = repr(str(mine))  # '/tmp/.../runs\x1b[0m/testrun', the ESC written out as \x1b
    assert "\\x1b[0m" in want
    assert _lines(r.stderr, "artifacts: ") == ["artifacts: " + want], r.stderr[-2000:]
    assert _lines(r.stderr, "report: ") == ["report: " + repr(str(mine / "report.html"))], r.stderr[-2000:]
    head = [ln for ln in r.stderr.splitlines() if "nsa-run run testrun -> " in ln]
    assert len(head) == 1 and f"-> {want} " in head[0], r.stderr[-2000:]
    # never the other run's folder, nor the raw ESC
    assert str(tmp_path / "runs" / "testrun") not in r.stderr and "\x1b" not in r.stderr

    # a rerun of x into it: the set-aside line and the report line name it visibly too
    s = _nsa(tmp_path, env, "stage", "x", "--device", "cpu", "--out", odd, text="MINE2")
    assert s.returncode == 0, s.stderr[-2000:]
    aside = [ln for ln in s.stderr.splitlines() if ln.startswith("earlier x result set aside in ")]
    assert len(aside) == 1 and repr(str(mine))[:-1] in aside[0], s.stderr[-2000:]
    assert _lines(s.stderr, "report: ") == ["report: " + repr(str(mine / "report.html"))], s.stderr[-2000:]
    assert str(tmp_path / "runs" / "testrun") not in s.stderr and "\x1b" not in s.stderr

    rep = _nsa(tmp_path, env, "report", f"{odd}/testrun")
    assert rep.returncode == 0, rep.stderr[-2000:]
    rel = f"{odd}/testrun"  # report names the folder as it was given
    assert _lines(rep.stdout, "report: ") == ["report: " + repr(f"{rel}/report.html")], rep.stdout
    assert _lines(rep.stdout, "summary.md: ")[0].startswith("summary.md: " + repr(f"{rel}/summary.md") + " ")


def test_a_newline_in_the_out_path_does_not_split_the_line(plugins, tmp_path):
    env = make(plugins)
    odd = "a\nb"
    r = _nsa(tmp_path, env, "oneshot", "--device", "cpu", "--only", "x", "--out", odd)
    assert r.returncode == 0, r.stderr[-2000:]
    mine = tmp_path / odd / "testrun"
    assert (mine / "x.txt").is_file()
    assert _lines(r.stderr, "artifacts: ") == ["artifacts: " + repr(str(mine))], r.stderr[-2000:]
    assert _lines(r.stderr, "report: ") == ["report: " + repr(str(mine / "report.html"))], r.stderr[-2000:]
    # no line starts with the path's second half
    assert not [ln for ln in r.stderr.splitlines() if ln.startswith("b/testrun")], r.stderr[-2000:]
    rep = _nsa(tmp_path, env, "report", str(mine))
    assert _lines(rep.stdout, "report: ") == ["report: " + repr(str(mine / "report.html"))], rep.stdout


def test_a_plain_path_is_printed_as_it_is(plugins, tmp_path):
    env = make(plugins)
    r = _nsa(tmp_path, env, "oneshot", "--device", "cpu", "--only", "x", "--out", "my runs")
    assert r.returncode == 0, r.stderr[-2000:]
    mine = tmp_path / "my runs" / "testrun"
    assert _lines(r.stderr, "artifacts: ") == [f"artifacts: {mine}"], r.stderr[-2000:]
