"""Bad days, red-team round 28 U28-6, through the CLI: a stage leaving another stage's log name (``logs/r27n.log``) as a
FIFO, a folder or a symlink PASSed; that other stage was then ERROR "the stage's log cannot be written" at every
later run, the culprit never named (round 27 B27-6's shape one level down). Expected: the stage that left it is
ERROR naming it; the thing is moved aside in ``logs/`` (``r27n.log.left-by-r27h``, nothing deleted) and the other
stage runs. Round 29 B29-2: a hard link there (a second name of one of the stage's files) the same."""

from __future__ import annotations

import os
import subprocess

import pytest

try:
    from _bad_days import cli_cmd, manifest
    from test_bad_days_round27_runner_names import STAGES
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, manifest
    from tests.runner.test_bad_days_round27_runner_names import STAGES

STAGES_WITH_DIR = STAGES.replace('''        elif kind == "fifo":''', '''        elif kind == "dir":
            target.mkdir()
        elif kind == "hardlink":
            (ctx.dir / "notes.txt").write_text("the stage's notes")
            os.link(ctx.dir / "notes.txt", target)
        elif kind == "fifo":''')


@pytest.mark.parametrize("kind", ["fifo", "dir", "symlink", "hardlink"])  # hardlink: round 29 B29-2
def test_a_log_name_left_by_a_stage_is_named_and_moved_aside(plugins, tmp_path, kind):
    plugins.make("r28-logs", "r28_logs", STAGES_WITH_DIR, {"r27h": "r28_logs:Leaves", "r27n": "r28_logs:After"})
    env = {**plugins.env(), "R27_NAME": "logs/r27n.log", "R27_KIND": kind}
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("stage", "r27h", "--out", out, "--device", "cpu"), env=env, capture_output=True,
                       text=True, timeout=600)
    (rec,) = manifest(out)["stages"]
    assert rec["status"] == "ERROR" and "the stage left logs/r27n.log" in rec["reason"], \
        (rec, r.stderr[-2000:])  # before: PASS
    logs = out / "testrun" / "logs"
    assert os.path.lexists(logs / "r27n.log.left-by-r27h"), sorted(os.listdir(logs))  # moved aside, not deleted
    r = subprocess.run(cli_cmd("stage", "r27n", "--out", out, "--device", "cpu"), env=env, capture_output=True,
                       text=True, timeout=600)
    recs = {s["name"]: (s["status"], s["reason"]) for s in manifest(out)["stages"]}
    assert r.returncode == 0 and recs["r27n"] == ("PASS", "r27n ok"), (recs, r.stderr[-2000:])  # before: ERROR
