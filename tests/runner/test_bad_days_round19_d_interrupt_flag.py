"""Round 19 review leftover, through the CLI: ``artifacts.planned_state`` (report's INTERRUPTED line: which planned
stages an interrupt stopped) recognised the interrupt's record by the text of its reason, so a stage's OWN ERROR
whose reason reads "interrupted (Ctrl-C): the stage was stopped" was listed as stopped by an interrupt. The executor
now writes an ``interrupted`` flag on every ERROR record (validated when read); planned_state uses it, and the
reason's text only for an ERROR record an older nsa-run wrote (no flag).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

try:
    from _bad_days import PINNED, cli_cmd, env_with, wait_for
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import PINNED, cli_cmd, env_with, wait_for

SOURCE = """
import os, time
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

class X(Stage):
    name, order, timeout_s = "x", 10, 120.0
    def run(self, ctx):  # its own ERROR, worded like the runner's interrupt record
        return StageResult(Status.ERROR, "interrupted (Ctrl-C): the stage was stopped")

class Y(Stage):
    name, order, timeout_s = "y", 11, 120.0
    def run(self, ctx):
        Path(os.environ["IF_MARK"]).write_text("y")
        time.sleep(120)
        return StageResult(Status.PASS, "y")

class Z(Stage):
    name, order, timeout_s = "z", 12, 120.0
    def run(self, ctx):
        return StageResult(Status.PASS, "z")
"""


def test_a_stages_own_error_worded_as_an_interrupt_is_not_the_interrupt(plugins, tmp_path):
    plugins.make("if-plugin", "if_mod", SOURCE, {"x": "if_mod:X", "y": "if_mod:Y", "z": "if_mod:Z"})
    env, out, mark = plugins.env(), tmp_path / "out", tmp_path / "mark"
    p = subprocess.Popen([sys.executable, "-c", PINNED, "oneshot", "--only", "x,y,z", "--out", str(out),
                          "--device", "cpu"], env=env_with(env, IF_MARK=mark), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        wait_for(mark, proc=p)
        p.send_signal(signal.SIGINT)
        so, se = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, so + se
    path = out / "testrun" / "manifest.json"
    m = json.loads(path.read_text())
    recs = {s["name"]: s for s in m["stages"]}

    def report() -> str:
        r = subprocess.run(cli_cmd("report", "testrun", "--out", out), env=env, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout
    text = report()
    assert "stopped by an interrupt: y;" in text and "1 planned stage(s) have no result: z" in text, text
    assert recs["x"]["interrupted"] is False and recs["y"]["interrupted"] is True, recs

    # a record an older nsa-run wrote (no flag): its interrupt is still known by its reason
    for s in m["stages"]:
        s.pop("interrupted", None)
    m.pop("_seal", None)
    for name in ("manifest.json", ".manifest.json.good"):
        (out / "testrun" / name).write_text(json.dumps(m, indent=2))
    assert "stopped by an interrupt: x, y;" in report()

    # the flag is checked like the record's other fields
    recs["y"]["interrupted"] = "yes"
    m["stages"] = [dict(s, interrupted="yes") if s["name"] == "y" else s for s in m["stages"]]
    for name in ("manifest.json", ".manifest.json.good"):
        (out / "testrun" / name).write_text(json.dumps(m, indent=2))
    r = subprocess.run(cli_cmd("report", "testrun", "--out", out), env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "'interrupted' must be true or false" in r.stderr, r.stdout + r.stderr
