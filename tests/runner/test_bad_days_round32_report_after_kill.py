"""Bad days, red-team rounds 32 B32-3 and 33 B33-6, through the CLI: ``report`` after ``kill -9`` of the runner
during a rerun said the rerun stage's file "is missing (deleted or moved?)", "repair or move the broken file aside",
exit 2, while the manifest's ``pending`` named the move to ``history/`` and the next ``stage`` puts the files back
(nothing was lost).

Round 33 B33-6: killed after the new attempt had written its file, ``report`` and ``compare`` read that file as the
run's (the manifest recorded v1, the timing shown was v2's: B/A 2.00 against itself, exit 0).

Expected: ``report`` reads the dead runner's move: UNFINISHED, naming where the earlier result waits and that the
next ``stage`` / ``oneshot`` puts it back; exit 0; what it reads of the stage is the recorded result's set-aside copy,
never the dead attempt's files."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest
from _bad_days import cli_cmd, env_with, manifest, wait_for

TIMED = """
import os, time
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

class W(Stage):
    name, order, timeout_s = "w", 10, 120.0
    def run(self, ctx):
        text = os.environ.get("BD_TEXT", "v1")
        mark = os.environ.get("BD_MARK")
        if mark:
            Path(mark).write_text(str(os.getpid()))
        ms = {"v1": "1.0", "v2": "2.0"}.get(text, "3.0")
        if os.environ.get("BD_WRITE_FIRST"):
            (ctx.dir / "w.csv").write_text(f"case,ms\\na,{ms}\\n")
        time.sleep(float(os.environ.get("BD_SLEEP_W", "0")))  # killed here: its earlier file is in history/
        (ctx.dir / "w.csv").write_text(f"case,ms\\na,{ms}\\n")  # a timing table: report reads it
        return StageResult(Status.PASS, f"w {text}", files=["w.csv"])
"""


@pytest.mark.parametrize("first", ["", "1"], ids=["killed-before-its-file", "killed-after-its-file"])
def test_report_after_a_killed_rerun_names_the_set_aside_result(plugins, cli, tmp_path, spawn, first):
    plugins.make("bd-timed", "bd_timed", TIMED, {"w": "bd_timed:W"})
    env = plugins.env()
    out = tmp_path / "out"
    first = subprocess.run(cli_cmd("stage", "w", "--out", out, "--device", "cpu"), env=env, capture_output=True,
                           text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    mark = tmp_path / "w.started"
    proc = spawn(cli_cmd("stage", "w", "--out", out, "--device", "cpu"),
                 env=env_with(env, BD_MARK=mark, BD_SLEEP_W=60, BD_TEXT="v2", BD_WRITE_FIRST=first),
                 stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True)
    wait_for(mark, proc=proc)
    (moved,) = [p["moved_to"] for p in manifest(out)["pending"] if p.get("stage") == "w"]
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    r = cli("report", "testrun", "--out", out)
    assert r.exit_code == 0, r.stdout + r.stderr  # before: 2, "the file is missing (deleted or moved?)"
    assert "missing" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert "UNFINISHED" in r.stdout and moved in r.stdout and "puts it back" in r.stdout, r.stdout
    # and what summary.md / report.html link is the recorded copy too (round 34 B34-5: ./w.csv and ./logs/w.log, the
    # dead attempt's)
    md = (out / "testrun" / "summary.md").read_text()
    page = (out / "testrun" / "report.html").read_text()
    assert f"(./{moved}/w.csv)" in md and f"(./{moved}/logs/w.log)" in md and "(./w.csv)" not in md, md
    assert f'href="./{moved}/w.csv"' in page and 'href="./w.csv"' not in page, page[-3000:]
    # what is read of the stage is the recorded result (v1: 1.0 ms), never the dead attempt's file (v2: 2.0 ms)
    c = cli("compare", "testrun", "testrun", "--out", out, "--json")
    assert c.exit_code == 0, c.stdout + c.stderr
    cells = [(row.get("a"), row.get("b")) for row in json.loads(c.stdout)["rows"] if row.get("source") == "w.csv"]
    assert cells and all(a == 1.0 and b == 1.0 for a, b in cells), cells
    # nothing lost: the next stage puts the earlier result back first, then reruns
    again = subprocess.run(cli_cmd("stage", "w", "--out", out, "--device", "cpu"), env=env_with(env, BD_TEXT="v3"),
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [s["reason"] for s in manifest(out)["stages"]] == ["w v3"]
    assert [h["reason"] for h in manifest(out)["history"]] == ["w v1"]
