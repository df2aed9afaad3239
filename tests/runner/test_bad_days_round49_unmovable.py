"""Bad days, red-team round 49 B49b-1, through the CLI: a rerun whose earlier declared folder cannot be renamed.

A stage declared a folder it left read-only (``chmod 555 d``, as ``cp -r`` of a read-only tree leaves it). Its
rerun moved the earlier result aside with ``shutil.move``, which, refused the rename, copied the folder to history
and deleted what it could of the original: ``d/sub/x.txt`` was gone in place, the manifest still recorded the earlier
PASS over the cut folder, a pending note and a lock token were left, and a partial copy sat in history. Moves inside
the run folder are renames only now: the rerun is refused (exit 2, naming the folder) and the earlier result stays
whole.

Permissions bind an ordinary user; as root (this suite's usual user in containers) nsa-run runs with the capabilities
that bypass them dropped (``setpriv``), as the red team ran it.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess

import pytest

try:
    from _bad_days import cli_cmd
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd

STAGE = """
import os, time
from nsa_runner import Stage, StageResult, Status


class D(Stage):
    name, order, timeout_s = "rtd", 10, 120.0

    def run(self, ctx):
        if os.environ.get("R49_FIRST"):
            (ctx.dir / "d" / "sub").mkdir(parents=True)
            (ctx.dir / "d" / "sub" / "x.txt").write_text("first")
            (ctx.dir / "d" / "y.txt").write_text("first")
            os.chmod(ctx.dir / "d", 0o555)
            return StageResult(Status.PASS, "first", files=["d"])
        if os.environ.get("R49_ATTEMPT"):  # the rerun's attempt: its own d, left read-only, then it is stopped
            (ctx.dir / "d" / "sub").mkdir(parents=True)
            (ctx.dir / "d" / "sub" / "x.txt").write_text("second")
            (ctx.dir / "d" / "y.txt").write_text("second")
            os.chmod(ctx.dir / "d", 0o555)
            open(os.environ["R49_ATTEMPT"], "w").write(str(os.getpid()))
            time.sleep(60)
        return StageResult(Status.PASS, "second", files=[])


class E(Stage):
    name, order, timeout_s = "rte", 20, 120.0

    def run(self, ctx):
        return StageResult(Status.PASS, "another stage")
"""

_CAPS = "-dac_override,-dac_read_search,-fowner"


def _as_a_user(cmd: list) -> list:
    if os.geteuid() != 0:
        return cmd
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: a read-only folder binds no one here")
    return [setpriv, "--bounding-set", _CAPS, "--inh-caps", _CAPS, *map(str, cmd)]


def test_a_rerun_over_an_earlier_folder_that_cannot_move_keeps_it_whole(plugins, tmp_path):
    plugins.make("r49-unmovable", "r49_unmovable", STAGE, {"rtd": "r49_unmovable:D", "rte": "r49_unmovable:E"})
    out = tmp_path / "o"
    env = plugins.env()
    first = subprocess.run(_as_a_user(cli_cmd("stage", "rtd", "--device", "cpu", "--out", out)),
                           env={**env, "R49_FIRST": "1"}, capture_output=True, text=True, timeout=300)
    run = out / "testrun"
    assert first.returncode == 0, first.stderr[-2000:]
    try:
        r = subprocess.run(_as_a_user(cli_cmd("stage", "rtd", "--device", "cpu", "--out", out)), env=env,
                           capture_output=True, text=True, timeout=300)
        # before: exit 2 "... these could not be put back: .../d (now .../history/rtd-.../d)", d/sub/x.txt deleted
        assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
        assert "cannot be moved" in r.stderr and "/d" in r.stderr, r.stderr[-2000:]
        assert "could not be put back" not in r.stderr, r.stderr[-2000:]
        assert "Traceback" not in r.stderr
        assert (run / "d" / "sub" / "x.txt").read_text() == "first"  # the earlier result, whole, in place
        assert (run / "d" / "y.txt").read_text() == "first"
        m = json.loads((run / "manifest.json").read_text())
        (rec,) = m["stages"]
        assert rec["reason"] == "first" and rec["files"] == ["d"], rec
        assert not m.get("pending"), m.get("pending")
        copies = [p for p in run.rglob("x.txt") if "history" in p.parts]
        assert copies == [], copies  # nothing copied aside
        assert not [p.name for p in run.iterdir() if p.name.startswith(".manifest.lock.")]
    finally:
        os.chmod(run / "d", stat.S_IRWXU)


def test_an_interrupted_rerun_whose_attempt_cannot_move_aside_loses_neither(plugins, tmp_path):
    """The put-back form: the rerun's attempt leaves its own ``d`` read-only and is stopped (SIGTERM). Before, the
    put-back copied and half-deleted the attempt's ``d`` (``d/sub/x.txt`` gone, two partial copies in history).
    Now both stay whole: the attempt's in place, the earlier one in history with the note that keeps it, and the
    next nsa-run into the folder (another stage) runs, saying what waits."""
    import signal

    from _bad_days import manifest, signalled_when

    plugins.make("r49-unmovable", "r49_unmovable", STAGE, {"rtd": "r49_unmovable:D", "rte": "r49_unmovable:E"})
    out, started = tmp_path / "o", tmp_path / "started"
    env = plugins.env()
    first = subprocess.run(_as_a_user(cli_cmd("stage", "rtd", "--device", "cpu", "--out", out)),
                           env={**env, "R49_FIRST": "1"}, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    run = out / "testrun"
    os.chmod(run / "d", stat.S_IRWXU)  # the earlier d can move aside; only the attempt's stays read-only
    try:
        rc, err = signalled_when(_as_a_user(cli_cmd("stage", "rtd", "--device", "cpu", "--out", out)),
                                 {**env, "R49_ATTEMPT": str(started)}, started, signal.SIGTERM)
        assert rc == 130, err[-2000:]
        assert (run / "d" / "sub" / "x.txt").read_text() == "second", err[-2000:]  # before: gone
        assert (run / "d" / "y.txt").read_text() == "second"
        (aside,) = [x for x in manifest(out).get("pending") or [] if x.get("stage") == "rtd"]
        earlier = run / aside["moved_to"] / "d"
        assert (earlier / "sub" / "x.txt").read_text() == "first" and (earlier / "y.txt").read_text() == "first"
        r = subprocess.run(_as_a_user(cli_cmd("stage", "rte", "--device", "cpu", "--out", out)), env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "could not all be put back: d" in r.stderr, r.stderr[-2000:]
        assert "Traceback" not in r.stderr
    finally:
        for d in (run / "d", *run.glob("history/*/d")):
            os.chmod(d, stat.S_IRWXU)
