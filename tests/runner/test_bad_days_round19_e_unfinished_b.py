"""Bad days, red-team round 19 part A, U-1 (/tmp/rt19a/report.md): ``compare A B`` where B is UNFINISHED
(planned x,y,z, kill -9'd mid-y) and A ran only x said "no regression", exit 0, beside an UNFINISHED note:
an unfinished B passed the gate. ``compare K K`` of the killed run too. A stage B planned, has no result for
and A has was already a regression ("!", round 18 A-R5); the ones A never ran had no row at all. The rule is
now the same for every stage B planned: no result in B is "!" (B set out to run it and did not: it passes no
gate on what it has), whatever A holds. A B whose planned stages all have a result is judged by its rows.

Through the CLI: ``oneshot`` into A and B, kill -9 of B's runner, ``compare``."""

from __future__ import annotations

import json
import signal
import subprocess
import time

try:
    from _bad_days import cli_cmd, env_with, make
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, env_with, make


def _compare(env, *args):
    r = subprocess.run(cli_cmd("compare", *args, "--json"), env=env, capture_output=True, text=True, timeout=300)
    return r, (json.loads(r.stdout) if r.stdout.strip() else None)


def test_an_unfinished_b_does_not_pass_the_gate(plugins, tmp_path, spawn):
    env = make(plugins)
    a = subprocess.run(cli_cmd("oneshot", "--only", "x", "--out", tmp_path / "a", "--device", "cpu"),
                       env=env_with(env), capture_output=True, text=True, timeout=300)
    assert a.returncode == 0, a.stdout + a.stderr
    run_a = tmp_path / "a" / "testrun"
    out_b = tmp_path / "b"
    proc = spawn(cli_cmd("oneshot", "--only", "x,y,z", "--out", out_b, "--device", "cpu"),
                 env=env_with(env, BD_SLEEP_Y=60), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = out_b / "testrun" / "logs" / "y.log"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (log.exists() and "y wrote" in log.read_text(errors="replace")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    run_b = out_b / "testrun"

    r, doc = _compare(env, run_a, run_b)
    assert r.returncode == 1 and doc is not None, r.stdout[-2000:] + r.stderr  # before: 0, "no regression"
    assert any(n.startswith("UNFINISHED: run B") for n in doc["notes"]), doc["notes"]
    marks = {row["key"]: (row["mark"], row["note"]) for row in doc["rows"] if row["section"] == "stage"}
    assert marks["x"][0] == "" and marks["y"][0] == "!" and marks["z"][0] == "!", marks
    assert "planned in B, no result there" in marks["z"][1], marks

    r, doc = _compare(env, run_b, run_b)  # the same unfinished run on both sides
    assert r.returncode == 1 and doc is not None, r.stdout[-2000:] + r.stderr  # before: 0
    marks = {row["key"]: row["mark"] for row in doc["rows"] if row["section"] == "stage"}
    assert marks["y"] == "!" and marks["z"] == "!", marks

    r, doc = _compare(env, run_b, run_a)  # A unfinished, B (complete) has what it planned: judged by its rows
    assert r.returncode == 0 and doc is not None, r.stdout[-2000:] + r.stderr
    assert doc["regressions"] == 0

    # the killed run finished by hand (stage y, stage z): every planned stage has its result, the gate passes
    for name in ("y", "z"):
        s = subprocess.run(cli_cmd("stage", name, "--out", out_b, "--device", "cpu"), env=env_with(env),
                           capture_output=True, text=True, timeout=300)
        assert s.returncode == 0, s.stdout + s.stderr
    r, doc = _compare(env, run_a, run_b)
    assert r.returncode == 0 and doc is not None and doc["regressions"] == 0, r.stdout[-2000:] + r.stderr
