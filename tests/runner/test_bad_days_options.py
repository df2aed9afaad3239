"""Bad days, red-team round 2 (issue 16): ``--out ""`` (it silently meant the current folder) and
``--timeout inf`` (a stage that never ends) are refused with exit 2, nothing created."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("args,word", [
    (("oneshot", "--out", ""), "empty path"),
    (("stage", "sanity", "--out", ""), "empty path"),
    (("report", "x", "--out", "  "), "empty path"),
    (("oneshot", "--timeout", "inf"), "finite"),
    (("stage", "sanity", "--timeout", "inf"), "finite"),
])
def test_empty_out_and_infinite_timeout_are_refused(cli, tmp_path, monkeypatch, args, word):
    monkeypatch.chdir(tmp_path)
    out = () if "--out" in args else ("--out", str(tmp_path / "out"))
    r = cli(*args, *out, "--device", "cpu") if args[0] != "report" else cli(*args)
    assert r.exit_code == 2, r.stdout + r.stderr
    assert word in " ".join((r.stdout + r.stderr).split()), r.stderr
    assert not list(tmp_path.iterdir())  # nothing created, neither in the cwd nor under --out
