"""Bad days, red-team round 18 (part A), through the CLI:

- A-R4: a baseline file (``compare --baseline``) with a key written twice was read last-wins: a second
  ``"tolerance"`` turned a 3x regression into "no regression", exit 0. Expected: one line naming the key, exit 2.
- A-R5: ``compare A B`` where B's runner was killed (kill -9) half-way said "no regression", exit 0: the stages B
  planned and never ran were only "not in B" (not comparable), nothing said B was unfinished. Expected: a note
  that B is unfinished, and a stage B planned without a result there is a regression ("!", exit 1).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

try:
    from _bad_days import cli_cmd, env_with, make
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, env_with, make

DECODE = """
import os
from nsa_runner import Stage, StageResult, Status

class PF(Stage):
    name, order, timeout_s = "pf", 16, 120.0
    def run(self, ctx):
        (ctx.dir / "decode.csv").write_text(f"S,B,ms_step\\n1024,1,{os.environ['M18_MS']}\\n")
        return StageResult(Status.PASS, "pf ok", files=["decode.csv"])
"""


def test_a_baseline_with_a_key_written_twice_is_refused(plugins, tmp_path):
    plugins.make("m18-pf", "m18_pf", DECODE, {"pf": "m18_pf:PF"})
    env = plugins.env()
    runs = {}
    for name, ms in (("a", "1.0"), ("b", "3.0")):
        r = subprocess.run(cli_cmd("stage", "pf", "--out", tmp_path / name, "--device", "cpu"),
                           env=env_with(env, M18_MS=ms), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        runs[name] = tmp_path / name / "testrun"
    base = tmp_path / "base.json"
    r = subprocess.run(cli_cmd("compare", runs["a"], "--save-baseline", base), env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and '"tolerance": ' in base.read_text(), r.stdout + r.stderr
    r = subprocess.run(cli_cmd("compare", runs["b"], "--baseline", base), env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr  # the 3x regression, as saved
    dup = tmp_path / "dup.json"
    text = base.read_text()
    i = text.index('"tolerance": ')
    dup.write_text(text[:i] + '"tolerance": 5.0, ' + text[i:])
    r = subprocess.run(cli_cmd("compare", runs["b"], "--baseline", dup), env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr  # before: "no regression", 0
    assert "the key 'tolerance' is written twice" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_compare_with_a_run_whose_runner_died_is_a_regression(plugins, tmp_path, spawn):
    env = make(plugins)
    a = subprocess.run(cli_cmd("oneshot", "--only", "x,y,z", "--out", tmp_path / "a", "--device", "cpu"),
                       env=env_with(env), capture_output=True, text=True, timeout=300)
    assert a.returncode == 0, a.stdout + a.stderr
    out_b = tmp_path / "b"
    proc = spawn(cli_cmd("oneshot", "--only", "x,y,z", "--out", out_b, "--device", "cpu"),
                 env=env_with(env, BD_SLEEP_Y=60), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = out_b / "testrun" / "logs" / "y.log"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (log.exists() and "y wrote" in log.read_text(errors="replace")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    r = subprocess.run(cli_cmd("compare", tmp_path / "a" / "testrun", out_b / "testrun", "--json"), env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr  # before: 0, "no regression"
    doc = json.loads(r.stdout)
    assert any(n.startswith("UNFINISHED: run B") for n in doc["notes"]), doc["notes"]
    marks = {row["key"]: row["mark"] for row in doc["rows"] if row["section"] == "stage"}
    assert marks.get("z") == "!" and marks.get("y") == "!", marks
