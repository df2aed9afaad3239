"""Bad days, red-team round 27 B27-6, through the CLI: a stage that left an undeclared file, FIFO or symlink named
``history`` (or ``logs``) in the run folder PASSed; the next stage was ERROR "log cannot be written" and every later
``nsa-run stage`` into that folder exited 2 "unusable", the culprit never named. Expected: the stage that left it is
ERROR naming what it left; the thing is moved aside (``history.left-by-<stage>``, nothing deleted) and the folder
stays usable for later commands."""

from __future__ import annotations

import os
import subprocess

import pytest

try:
    from _bad_days import cli_cmd, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, manifest

STAGES = """
import os
from nsa_runner import Stage, StageResult, Status

class Leaves(Stage):
    name, order, timeout_s = "r27h", 11, 120.0
    def run(self, ctx):
        target = ctx.dir / os.environ["R27_NAME"]
        kind = os.environ["R27_KIND"]
        if kind == "file":
            target.write_text("the stage's notes")
        elif kind == "fifo":
            os.mkfifo(target)
        else:
            target.symlink_to("/tmp")
        return StageResult(Status.PASS, "r27h ok")

class After(Stage):
    name, order, timeout_s = "r27n", 12, 120.0
    def run(self, ctx):
        return StageResult(Status.PASS, "r27n ok")
"""


@pytest.mark.parametrize(("name", "kind"), [("history", "file"), ("history", "fifo"), ("history", "symlink")])
def test_a_runner_owned_name_left_by_a_stage_is_named_and_moved_aside(plugins, tmp_path, name, kind):
    plugins.make("r27-names", "r27_names", STAGES, {"r27h": "r27_names:Leaves", "r27n": "r27_names:After"})
    env = {**plugins.env(), "R27_NAME": name, "R27_KIND": kind}
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("stage", "r27h", "--out", out, "--device", "cpu"), env=env, capture_output=True,
                       text=True, timeout=600)
    (rec,) = manifest(out)["stages"]
    assert rec["status"] == "ERROR" and f"the stage left {name} in the run folder" in rec["reason"], \
        (rec, r.stderr[-2000:])  # before: PASS
    run = out / "testrun"
    assert os.path.lexists(run / f"{name}.left-by-r27h"), sorted(os.listdir(run))  # moved aside, not deleted
    r = subprocess.run(cli_cmd("stage", "r27n", "--out", out, "--device", "cpu"), env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]  # before: exit 2, "run folder is unusable" (or the log unwritable)
    recs = {s["name"]: s["status"] for s in manifest(out)["stages"]}
    assert recs["r27n"] == "PASS", recs
