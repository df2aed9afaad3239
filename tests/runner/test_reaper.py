"""The tree kill of a finished stage runs beside the next stage (``executor._Reaper``; issue 13): the
worker's exit (the kernel freeing a CUDA context: ~0.6 s per stage on the H100) no longer holds the
next stage up. The stage's processes are frozen (SIGSTOP) before its result is read and killed
(SIGKILL) beside the next stage (round 15 A1: nothing of it acts beside the next one), and nothing of
any stage outlives the run."""

from __future__ import annotations

import json
import subprocess

from _bad_days import alive, cli_cmd, manifest

SOURCE = """
import atexit, json, os, signal, time
from nsa_runner import Stage, StageResult, Status

def _slow_exit():  # a process whose exit takes a while (as one freeing a CUDA context), TERM or not
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(5.0)  # a SIGKILL ends it after the 3 s grace

class X(Stage):
    name, order, timeout_s = "x", 10, 120.0
    def run(self, ctx):
        atexit.register(_slow_exit)
        (ctx.dir / "x.json").write_text(json.dumps({"pid": os.getpid()}))
        return StageResult(Status.PASS, "x ok", files=["x.json"])

class Y(Stage):
    name, order, timeout_s = "y", 11, 120.0
    preload = False  # a fresh worker: starts in well under the 3 s x takes to die
    def run(self, ctx):
        x = json.loads((ctx.dir / "x.json").read_text())["pid"]
        try:  # T: frozen (round 15 A1: never running beside y), Z: killed, "": gone
            with open(f"/proc/{x}/stat", "rb") as f:
                state = f.read().rpartition(b")")[2].split()[0].decode()
        except OSError:
            state = ""
        (ctx.dir / "y.json").write_text(json.dumps({"x_state_at_start": state}))
        return StageResult(Status.PASS, "y ok", files=["y.json"])
"""


def test_the_next_stage_starts_while_the_finished_one_is_still_dying_and_nothing_outlives_the_run(plugins, tmp_path):
    """Before the reaper: y began only once x's process was gone (its exit took 3 s: the SIGKILL after
    the grace period). Now y begins at once, x frozen (or killed already), never running beside y; x is
    killed (its record PASS), and gone when nsa-run returns."""
    plugins.make("reap-plugin", "reap_mod", SOURCE, {"x": "reap_mod:X", "y": "reap_mod:Y"})
    out = tmp_path / "out"
    r = subprocess.run(cli_cmd("oneshot", "--out", out, "--only", "x,y", "--device", "cpu"), env=plugins.env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [s["status"] for s in manifest(out)["stages"]] == ["PASS", "PASS"]
    run = out / "testrun"
    # x is frozen before its result is read (SIGSTOP), killed beside y: never running while y runs
    assert json.loads((run / "y.json").read_text())["x_state_at_start"] in ("T", "Z", ""), (run / "y.json").read_text()
    assert not alive(json.loads((run / "x.json").read_text())["pid"])
