"""Bad days, red-team round 16 (part A) A3 / A4 / A7, through the CLI: what a stage writes at manifest.json is
never taken for the run's records.

A3: a stage rewriting manifest.json as *valid* JSON (stage a's FAIL turned PASS, or a's record dropped) was
taken as the fresh state under the lock: every summary said what the stage wrote.
A4: U5's keep-aside (a hard link) failed on a folder put at manifest.json, and on 999 taken
``manifest.json.corrupt-<n>`` names: the run ended "incomplete", the records were lost and every later command
into the --out exited 2 "earlier run folder is unusable".
(And the same with the runner's copy of its last write forged too: the runner keeps its own records.)
A7: U5's rewrite from the oneshot's own (stale) copy dropped the record a concurrent ``nsa-run stage b`` made.

Expected: the last manifest written under the run folder's lock is kept (``.manifest.json.good``); whatever
else is at manifest.json is moved aside as ``manifest.json.corrupt-<n>`` and that copy is put back, with every
writer's records; the stage that was running is ERROR saying so, and later commands into the --out work.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

try:
    from _bad_days import MAIN, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with

STAGES = """
import json, os, time
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

def _forge(ctx, how):
    m = ctx.dir / "manifest.json"
    if how in ("pass", "drop", "both"):
        d = json.loads(m.read_text())
        if how != "drop":
            for s in d["stages"]:
                if s["name"] == "a":
                    s["status"], s["reason"] = "PASS", "looks fine"
        else:
            d["stages"] = [s for s in d["stages"] if s["name"] != "a"]
        t = ctx.dir / "m.tmp"
        t.write_text(json.dumps(d))
        if how == "both":  # the runner's copy of its last write forged as well
            (ctx.dir / ".manifest.json.good").write_text(json.dumps(d))
        os.rename(t, m)
    elif how == "dir":
        m.unlink()
        m.mkdir()
        (m / "x").write_text("x")
    elif how == "names":
        for n in range(1, 1000):
            (ctx.dir / f"manifest.json.corrupt-{n}").write_text("x")
        m.write_text("garbage{{{")
    elif how == "garbage":
        m.write_text("garbage{{{")

def _act(ctx, name):
    go = os.environ.get("R16I_WAIT")
    if go and name == "a":
        Path(go + ".started").write_text("a")
        for _ in range(6000):  # until the test says go (an ordering, not a timing: 10 min at most)
            if os.path.exists(go):
                break
            time.sleep(0.1)
    (ctx.dir / f"{name}.txt").write_text(name)
    if os.environ.get("R16I_FORGER") == name:
        _forge(ctx, os.environ["R16I_HOW"])
    if name == "a" and os.environ.get("R16I_A_FAIL"):
        return StageResult(Status.FAIL, "a real fail", files=["a.txt"])
    return StageResult(Status.PASS, f"{name} ok", files=[f"{name}.txt"])

class A(Stage):
    name, order, timeout_s = "a", 10, 600.0
    def run(self, ctx): return _act(ctx, "a")

class B(Stage):
    name, order, timeout_s = "b", 20, 120.0
    def run(self, ctx): return _act(ctx, "b")
"""


def _env(plugins, **extra):
    if not getattr(plugins, "_r16i_made", False):
        plugins.make("r16i-ma", "r16i_ma_mod", STAGES, {"a": "r16i_ma_mod:A", "b": "r16i_ma_mod:B"})
        plugins._r16i_made = True
    return env_with(plugins.env(), **extra)


def _cli(env, *args):
    return subprocess.run([sys.executable, "-c", MAIN, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=600)


def _stages(run):
    m = json.loads((run / "manifest.json").read_text())
    return m, {s["name"]: s for s in m["stages"]}


def _later_commands_work(env, out):
    for args in (("stage", "a"), ("oneshot", "--only", "b")):
        r = _cli(env, *args, "--out", out, "--device", "cpu")
        assert r.returncode == 0, (args, r.stderr[-3000:])
        assert "unusable" not in r.stderr and "Traceback" not in r.stderr


def test_a_stage_rewriting_the_manifest_as_valid_json_is_undone_and_named(plugins, tmp_path):
    for how in ("pass", "drop", "both"):
        out = tmp_path / how
        run = out / "testrun"
        env = _env(plugins, R16I_A_FAIL="1", R16I_FORGER="b", R16I_HOW=how)
        r = _cli(env, "oneshot", "--only", "a,b,summary", "--out", out, "--device", "cpu")
        assert r.returncode == 1 and "Traceback" not in r.stderr, (how, r.returncode, r.stderr[-3000:])
        m, got = _stages(run)
        assert got["a"]["status"] == "FAIL" and got["a"]["reason"] == "a real fail", (how, got.get("a"))
        assert got["b"]["status"] == "ERROR", (how, got["b"])
        assert "manifest.json was overwritten during this stage" in got["b"]["reason"]
        assert "manifest.json.corrupt-1" in got["b"]["reason"] and "manifest.json.corrupt-1" in r.stderr
        forged = json.loads((run / "manifest.json.corrupt-1").read_text())  # what b wrote, kept aside
        assert [s["name"] for s in forged["stages"]] == ([] if how == "drop" else ["a"])
        assert m["finished"] and not m.get("pending")
        summary = json.loads((run / "summary.json").read_text())  # the summaries say what the runner recorded
        assert "a real fail" in json.dumps(summary) and "looks fine" not in json.dumps(summary), how
        assert "looks fine" not in (run / "summary.md").read_text()


def test_a_folder_at_manifest_json_is_moved_aside_and_the_out_stays_usable(plugins, tmp_path):
    out, run = tmp_path / "out", tmp_path / "out" / "testrun"
    env = _env(plugins, R16I_FORGER="b", R16I_HOW="dir")
    r = _cli(env, "oneshot", "--only", "a,b,summary", "--out", out, "--device", "cpu")
    assert r.returncode == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-3000:])
    m, got = _stages(run)
    assert [got[n]["status"] for n in ("a", "b", "summary")] == ["PASS", "ERROR", "PASS"], got
    assert (run / "manifest.json.corrupt-1").is_dir() and (run / "manifest.json.corrupt-1" / "x").read_text() == "x"
    assert "manifest.json.corrupt-1" in got["b"]["reason"]
    _later_commands_work(_env(plugins), out)


def test_all_numbered_aside_names_taken_still_keeps_the_records(plugins, tmp_path):
    out, run = tmp_path / "out", tmp_path / "out" / "testrun"
    env = _env(plugins, R16I_FORGER="b", R16I_HOW="names")
    r = _cli(env, "oneshot", "--only", "a,b,summary", "--out", out, "--device", "cpu")
    assert r.returncode == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-3000:])
    m, got = _stages(run)
    assert [got[n]["status"] for n in ("a", "b", "summary")] == ["PASS", "ERROR", "PASS"], got
    kept = [p for p in run.glob("manifest.json.corrupt-*") if p.read_text() == "garbage{{{"]
    assert len(kept) == 1 and kept[0].name in got["b"]["reason"], (kept, got["b"]["reason"])
    _later_commands_work(_env(plugins), out)


def test_a_concurrent_stage_command_keeps_its_record_when_the_manifest_is_overwritten(plugins, tmp_path):
    out, run = tmp_path / "out", tmp_path / "out" / "testrun"
    go = tmp_path / "go"
    env = _env(plugins, R16I_WAIT=str(go), R16I_FORGER="a", R16I_HOW="garbage")
    proc = subprocess.Popen([sys.executable, "-c", MAIN, "oneshot", "--only", "a,summary", "--out", str(out),
                             "--device", "cpu"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started = tmp_path / "go.started"
        for _ in range(3000):
            if started.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert started.exists(), proc.communicate(timeout=60)
        r = _cli(_env(plugins), "stage", "b", "--out", out, "--device", "cpu")  # while a runs
        assert r.returncode == 0, r.stderr[-3000:]
        assert _stages(run)[1]["b"]["status"] == "PASS"
        go.write_text("go")
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1 and "Traceback" not in err, (proc.returncode, err[-3000:])
    m, got = _stages(run)
    assert got["b"]["status"] == "PASS" and got["b"]["files"] == ["b.txt"], got.get("b")
    assert got["a"]["status"] == "ERROR" and "manifest.json was overwritten" in got["a"]["reason"], got["a"]
    assert got["summary"]["status"] == "PASS"
    assert (run / "manifest.json.corrupt-1").read_text() == "garbage{{{"
    assert m["finished"] and not m.get("pending")
