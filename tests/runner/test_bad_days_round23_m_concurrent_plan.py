"""Bad days, red-team round 23 B23-7, through the CLI: ``nsa-run stage y`` into the folder of a running oneshot
that has y still to come PASSed, then the oneshot ran y and overwrote it (y.txt, the manifest's record), with no
history entry and no word: a finished result destroyed. Expected: the oneshot's y is a rerun there, the other
result set aside into history/ as ``stage y`` sets an earlier one aside, and the oneshot says so."""

from __future__ import annotations

import json
import subprocess

try:
    from _bad_days import cli_cmd, env_with, manifest, wait_for
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, env_with, manifest, wait_for

STAGES = """
import os, time
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

def _act(ctx, name):
    text = os.environ["CP_TEXT"]
    if name == "x":  # the oneshot's first stage: it waits for the test's go
        Path(os.environ["CP_STARTED"]).write_text("x")
        deadline = time.monotonic() + 120
        while not Path(os.environ["CP_GO"]).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    (ctx.dir / f"{name}.txt").write_text(text)
    return StageResult(Status.PASS, f"{name} {text}", files=[f"{name}.txt"])

class X(Stage):
    name, order, timeout_s = "x", 10, 180.0
    def run(self, ctx):
        return _act(ctx, "x")

class Y(Stage):
    name, order, timeout_s = "y", 11, 180.0
    def run(self, ctx):
        return _act(ctx, "y")
"""


def test_a_stage_recorded_meanwhile_in_a_oneshots_folder_is_set_aside_not_overwritten(plugins, tmp_path):
    plugins.make("cp-stages", "cp_mod", STAGES, {"x": "cp_mod:X", "y": "cp_mod:Y"})
    out, started, go = tmp_path / "o", tmp_path / "started", tmp_path / "go"
    env = env_with(plugins.env(), CP_STARTED=str(started), CP_GO=str(go))
    one = subprocess.Popen(cli_cmd("oneshot", "--only", "x,y", "--out", out, "--device", "cpu"),
                           env=env_with(env, CP_TEXT="oneshot"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        wait_for(started, timeout=300, proc=one)  # the oneshot runs x; y is still to come
        mine = subprocess.run(cli_cmd("stage", "y", "--out", out, "--device", "cpu"),
                              env=env_with(env, CP_TEXT="mine"), capture_output=True, text=True, timeout=600)
        assert mine.returncode == 0, mine.stderr[-3000:]
    finally:
        go.write_text("go")
    stdout, stderr = one.communicate(timeout=600)
    assert one.returncode == 0, (stdout[-2000:], stderr[-2000:])
    run = out / "testrun"
    data = manifest(out)
    recs = {s["name"]: s for s in data["stages"]}
    assert recs["y"]["reason"] == "y oneshot" and (run / "y.txt").read_text() == "oneshot", recs["y"]
    # the other nsa-run's y: in history, whole, and named there
    kept = [h for h in data["history"] if h.get("name") == "y"]
    assert len(kept) == 1 and kept[0]["reason"] == "y mine", json.dumps(data["history"])[:2000]
    files = [p for p in (run / "history").rglob("y.txt")]
    assert [p.read_text() for p in files] == ["mine"], files
    assert "earlier y result" in stderr and "set aside" in stderr, stderr[-2000:]
