"""Bad days, red-team round 3 (issue 16): new probes of the same families, each through the CLI.

Every test here reproduces an attack that worked on the code before round 3's fixes (see
docs/reliability.md, "Red-team round 3"): run folders whose ``logs`` / ``history`` point out, a
stage that plants a symlink as a later stage's log, declared names nested in another stage's,
a rerun killed before a newer run folder appeared, daemons that clear their environment, plugins
whose attributes change between reads or that forge the discovery records, a plugin named like a
built-in stage, a ``--debug`` stage option, rich markup or escape sequences in paths and reasons,
a symlink loop as ``--out``, a FIFO as ``--baseline``, and hand-broken ``pending`` notes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from nsa_runner.artifacts import load_manifest

try:
    from _bad_days import STAGES_XYZ, alive, cli_cmd, env_with, gone_within, wait_for
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import STAGES_XYZ, alive, cli_cmd, env_with, gone_within, wait_for

# stages x, y whose behaviour comes from the environment: R3_<NAME>_MK (a shell command run in the
# run folder), R3_<NAME>_FILES (extra declared names, JSON), R3_<NAME>_DAEMON (a file: start a
# daemon with an EMPTY environment and write its pid there), R3_<NAME>_REASON, R3_SLEEP
SOURCE = """
import json, os, subprocess, time
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

def _act(ctx, name):
    up = name.upper()
    text = os.environ.get("R3_TEXT", "v1")
    (ctx.dir / f"{name}.txt").write_text(text)
    files = [f"{name}.txt"] + json.loads(os.environ.get(f"R3_{up}_FILES", "[]"))
    if os.environ.get(f"R3_{up}_MK"):
        subprocess.run(os.environ[f"R3_{up}_MK"], shell=True, cwd=ctx.dir, check=True)
    if os.environ.get(f"R3_{up}_DAEMON"):  # setsid forks again (already a session leader): the
        # daemon, in a session of its own with an empty environment, writes its own pid
        subprocess.Popen(["setsid", "sh", "-c", f"echo $$ > {os.environ[f'R3_{up}_DAEMON']}; exec sleep 1000"],
                         env={}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
        time.sleep(0.5)
    if os.environ.get("R3_MARK"):
        Path(os.environ["R3_MARK"]).write_text(text)
    time.sleep(float(os.environ.get(f"R3_SLEEP_{up}", "0")))
    return StageResult(Status.PASS, os.environ.get(f"R3_{up}_REASON", f"{name} {text}"), files=files)
""" + STAGES_XYZ


@pytest.fixture
def r3(plugins):
    plugins.make("r3-plugin", "r3_mod", SOURCE, {"x": "r3_mod:X", "y": "r3_mod:Y"})
    env = plugins.env()
    for k in [k for k in env if k.startswith("R3_")]:
        env.pop(k)
    return env


def _run(env, *args, timeout=300, **kw):
    return subprocess.run(cli_cmd(*args), env=env, capture_output=True, text=True, timeout=timeout, **kw)


def _entries(out: Path, run: str = "testrun") -> dict[str, dict]:
    return {s["name"]: s for s in load_manifest(out / run)["stages"]}


# ---- containment -------------------------------------------------------------------------------


@pytest.mark.parametrize("shared", ["logs", "history"])
def test_a_rerun_never_writes_or_moves_through_a_symlinked_logs_or_history(r3, tmp_path, shared):
    out, outside = tmp_path / "out", tmp_path / "outside"
    outside.mkdir()
    assert _run(r3, "oneshot", "--out", out, "--only", "x", "--device", "cpu").returncode == 0
    run = out / "testrun"
    if shared == "logs":
        (run / "logs").rename(outside / "logs")
        (run / "logs").symlink_to(outside / "logs")
    else:
        (run / "history").symlink_to(outside)
    before = sorted((p.relative_to(outside), p.read_bytes() if p.is_file() else b"") for p in outside.rglob("*"))
    r = _run(r3, "stage", "x", "--out", out, "--device", "cpu")
    assert r.returncode == 2, r.stderr
    assert f"{shared} is a symlink" in r.stderr and "Traceback" not in r.stderr
    after = sorted((p.relative_to(outside), p.read_bytes() if p.is_file() else b"") for p in outside.rglob("*"))
    assert after == before  # nothing written or moved outside the run folder
    assert (run / "x.txt").read_text() == "v1"


@pytest.mark.parametrize("plant", ["ln -s {victim} logs/y.log", "mkfifo logs/y.log", "ln {victim} logs/y.log"])
def test_a_stage_cannot_plant_a_later_stages_log(r3, tmp_path, plant):
    out = tmp_path / "out"
    victim = out.parent / "victim.txt"  # same file system: a hard link works too
    victim.write_text("precious")
    env = env_with(r3, R3_X_MK=plant.format(victim=victim))
    r = _run(env, "oneshot", "--out", out, "--only", "x,y", "--device", "cpu", timeout=120)
    assert r.returncode == 1, r.stderr
    st = _entries(out)
    # since round 28 U28-6 / round 29 B29-2 the stage that planted it is the one named (y was ERROR "refused", every
    # run, x PASS), the plant moved aside, and y's own log written
    assert st["x"]["status"] == "ERROR" and "the stage left logs/y.log" in st["x"]["reason"], st["x"]
    assert st["y"]["status"] == "PASS", st["y"]
    assert os.path.lexists(out / "testrun" / "logs" / "y.log.left-by-x")
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("x_files, y_files, y_mk", [
    (["sub/f.txt"], ["sub"], "true"),        # y declares a folder holding x's file
    (["sub"], ["sub/g.txt"], "echo y > sub/g.txt"),  # y declares a file inside x's folder
])
def test_declared_names_nested_in_another_stages_are_refused(r3, tmp_path, x_files, y_files, y_mk):
    out = tmp_path / "out"
    env = env_with(r3, R3_X_MK="mkdir -p sub && echo x > sub/f.txt", R3_X_FILES=json.dumps(x_files),
                   R3_Y_MK=f"mkdir -p sub && {y_mk}", R3_Y_FILES=json.dumps(y_files))
    r = _run(env, "oneshot", "--out", out, "--only", "x,y", "--device", "cpu")
    assert r.returncode == 1, r.stderr
    st = _entries(out)
    assert st["x"]["status"] == "PASS"
    assert st["y"]["status"] == "ERROR" and "of another stage" in st["y"]["reason"]
    assert y_files[0] not in st["y"]["files"]
    # a rerun of y never takes x's file with it
    assert _run(env, "stage", "y", "--out", out, "--device", "cpu").returncode == 1
    assert (out / "testrun" / "sub" / "f.txt").read_text() == "x\n"


# ---- reruns ------------------------------------------------------------------------------------


def test_a_killed_rerun_is_put_back_even_after_a_newer_run_folder_appeared(r3, tmp_path, spawn):
    out, mark = tmp_path / "out", tmp_path / "mark"
    assert _run(r3, "oneshot", "--out", out, "--only", "x", "--device", "cpu").returncode == 0
    proc = spawn(cli_cmd("stage", "x", "--out", out, "--device", "cpu"),
                 env=env_with(r3, R3_TEXT="v2", R3_MARK=mark, R3_SLEEP_X=120),
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(mark, proc=proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(1.0)
    # a new oneshot makes testrun.2: `stage` never opens testrun again, yet its rerun is put back
    assert _run(r3, "oneshot", "--out", out, "--only", "y", "--device", "cpu").returncode == 0
    assert (out / "testrun.2").is_dir()
    m = load_manifest(out / "testrun")
    assert not m.get("pending")
    assert (out / "testrun" / "x.txt").read_text() == "v1"
    assert any(p.name.endswith("-abandoned") for p in (out / "testrun" / "history").iterdir())


# ---- process hygiene ---------------------------------------------------------------------------


def test_a_daemon_with_an_empty_environment_dies_with_its_stage(r3, tmp_path):
    out, pidfile = tmp_path / "out", tmp_path / "daemon.pid"
    r = _run(env_with(r3, R3_X_DAEMON=pidfile), "oneshot", "--out", out, "--only", "x", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    pid = int(wait_for(pidfile))
    try:
        assert gone_within(pid, 10), "the stage's setsid daemon without the cookie outlived its PASS"
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_daemon_with_an_empty_environment_dies_when_the_runner_is_killed(r3, tmp_path, spawn):
    out, pidfile, mark = tmp_path / "out", tmp_path / "daemon.pid", tmp_path / "mark"
    proc = spawn(cli_cmd("oneshot", "--out", out, "--only", "x", "--device", "cpu"),
                 env=env_with(r3, R3_X_DAEMON=pidfile, R3_MARK=mark, R3_SLEEP_X=120),
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(mark, proc=proc)
    pid = int(wait_for(pidfile))
    time.sleep(1.5)  # the watchdog looks at the stage's tree twice a second
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    try:
        assert gone_within(pid, 15), "the daemon outlived the runner's kill -9"
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


DAEMON_AT_IMPORT = """
import os, subprocess
from pathlib import Path
subprocess.Popen(["setsid", "sh", "-c", f"echo $$ > {os.environ['R3_IMPORT_DAEMON']}; exec sleep 1000"], env={},
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
from nsa_runner import Stage, StageResult, Status

class D(Stage):
    name, order = "d", 10
    def run(self, ctx):
        return StageResult(Status.PASS, "ok")
"""


def test_a_daemon_a_plugin_import_starts_without_environment_is_killed(plugins, tmp_path):
    plugins.make("dm-plugin", "dm_mod", DAEMON_AT_IMPORT, {"d": "dm_mod:D"})
    pidfile = tmp_path / "daemon.pid"
    r = _run(env_with(plugins.env(), R3_IMPORT_DAEMON=pidfile), "list", "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    pid = int(wait_for(pidfile))
    try:
        assert gone_within(pid, 10), "the plugin's daemon outlived plugin discovery"
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


# ---- hostile plugins ---------------------------------------------------------------------------

TRICKS = """
import math, os, sys, json, time
from nsa_runner import Option, Stage, StageResult, Status

if os.environ.get("R3_PATCH"):  # the plugin switches the discovery child's checks off
    import nsa_runner.registry as r
    r._problems = lambda info, ep: []
if os.environ.get("R3_FORGE"):  # the plugin writes records of its own into the child's result file
    with open(sys.argv[1], "a") as f:
        f.write(json.dumps({"entry": {"key": "zz\\tforged\\tx:y", "name": "forged", "value": "x:y", "dist": "zz",
                 "version": "1", "stage": {"name": "forged", "order": "abc", "requires": 5, "description": None,
                 "timeout_s": "nan", "options": [{"flag": 1}]}}}) + "\\n")
        f.write(json.dumps({"entry": {"key": ["not", "a", "key"]}}) + "\\n")
        f.write(json.dumps({"done": True}) + "\\n")

class Flip(Stage):
    name, order = "flip", 10
    reads = 0
    @property
    def timeout_s(self):  # 2 s to whoever looks first, NaN (never times out) after
        Flip.reads += 1
        return 2.0 if Flip.reads == 1 else float("nan")
    def run(self, ctx):
        time.sleep(1000)

class NanTimeout(Stage):
    name, order, timeout_s = "nan", 11, float("nan")
    def run(self, ctx):
        return StageResult(Status.PASS, "ok")

class Summary(Stage):
    name, order = "summary", 1
    def run(self, ctx):
        return StageResult(Status.PASS, "not the built-in")

class Debug(Stage):
    name, order = "dbg", 12
    options = (Option("--debug", default="x"),)
    def run(self, ctx):
        return StageResult(Status.PASS, "ok")
"""


def _tricks(plugins, **entries):
    plugins.make("trick-plugin", "trick_mod", TRICKS, entries)
    return plugins.env()


def _listed(r) -> dict[str, dict]:
    return {s["name"]: s for s in json.loads(r.stdout)["stages"]}


def test_an_attribute_is_read_once_what_is_checked_is_what_runs(plugins, tmp_path):
    env = _tricks(plugins, flip="trick_mod:Flip")
    t0 = time.monotonic()
    r = _run(env, "oneshot", "--out", tmp_path / "out", "--only", "flip", "--device", "cpu", timeout=120)
    assert r.returncode == 1, r.stderr
    flip = _entries(tmp_path / "out")["flip"]
    assert flip["status"] == "TIMEOUT" and "after 2s" in flip["reason"]
    assert time.monotonic() - t0 < 100


def test_the_cli_checks_the_discovery_childs_records_again(plugins):
    env = env_with(_tricks(plugins, nan="trick_mod:NanTimeout"), R3_PATCH=1)
    r = _run(env, "list", "--device", "cpu", "--json")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "timeout_s must be a positive number" in _listed(r)["nan"]["why_not"]


def test_forged_discovery_records_neither_crash_the_cli_nor_hide_the_built_ins(plugins):
    env = env_with(_tricks(plugins, nan="trick_mod:NanTimeout"), R3_FORGE=1)
    r = _run(env, "list", "--device", "cpu", "--json")
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "unexpected" not in r.stderr
    listed = _listed(r)
    assert listed["forged"]["runs_here"] is False and "order must be an int" in listed["forged"]["why_not"]
    assert listed["sanity"]["runs_here"] is True  # the forged "done" did not end discovery early


def test_a_plugin_named_like_a_built_in_stage_leaves_the_built_in_alone(plugins, tmp_path):
    env = _tricks(plugins, summary="trick_mod:Summary")
    r = _run(env, "list", "--device", "cpu", "--json")
    assert r.returncode == 1, r.stderr
    listed = _listed(r)
    assert listed["summary"]["source"] == "built-in" and listed["summary"]["runs_here"] is True
    broken = [s for n, s in listed.items() if n.startswith("invalid:") and "summary" in n]
    assert broken and "taken by the built-in stage" in broken[0]["why_not"]
    r = _run(env, "oneshot", "--out", tmp_path / "out", "--only", "summary", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert _entries(tmp_path / "out")["summary"]["source"] == "built-in"


def test_a_stage_option_named_debug_is_refused(plugins):
    r = _run(_tricks(plugins, dbg="trick_mod:Debug"), "list", "--device", "cpu", "--json")
    assert "['--debug'] are reserved" in _listed(r)["dbg"]["why_not"]


# ---- odd text ----------------------------------------------------------------------------------


def test_an_out_path_with_rich_markup_runs(r3, tmp_path):
    out = tmp_path / "[/]" / "[bold]x"
    r = _run(r3, "oneshot", "--out", out, "--only", "x", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "unexpected" not in r.stderr and f"artifacts: {out / 'testrun'}" in r.stderr
    assert (out / "testrun" / "report.html").is_file() and (out / "testrun" / "junit.xml").is_file()


def test_a_reason_never_sends_escape_sequences_to_the_progress_lines(r3, tmp_path):
    env = env_with(r3, R3_X_REASON="\x1b[2J\x1b]8;;javascript:alert(1)\x1b\\link\x1b]8;;\x1b\\ \r\x07done")
    r = _run(env, "oneshot", "--out", tmp_path / "out", "--only", "x", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr and "\x1b" not in r.stdout
    assert "linkdone" in r.stderr.replace(" ", "")


# ---- disk and special files --------------------------------------------------------------------


def test_an_out_symlink_loop_is_one_line_naming_it(cli, tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    r = cli("oneshot", "--out", tmp_path / "a", "--only", "summary", "--device", "cpu")
    assert r.exit_code == 2
    assert "cannot be resolved" in r.stderr and "unexpected" not in r.stderr


@pytest.mark.parametrize("kind", ["fifo", "zero", "folder"])
def test_a_baseline_that_is_not_a_regular_file_is_named_as_what_it_is(cli, tmp_path, kind):
    path = tmp_path / "base.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    r = cli("oneshot", "--out", tmp_path / "out", "--only", "summary", "--device", "cpu", "--baseline", path)
    assert r.exit_code == 2
    what = {"fifo": "a FIFO", "zero": "a character device", "folder": "a folder"}[kind]
    assert f"is {what}, not a baseline file" in r.stderr
    assert not (tmp_path / "out").exists()


# ---- hand-broken manifests -----------------------------------------------------------------------


@pytest.mark.parametrize("pending, named", [
    ([1], "pending[0]: must be an object"),
    ([{"stage": 5}], "pending[0]: 'stage' must be a string"),
    ([{"stage": "x", "owner": {"pid": "abc", "hostname": 5}}], "pending[0]: 'owner' must hold pid"),
    ([{"stage": "x", "owner": {"pid": 1, "hostname": "h"}, "moved_to": "../../elsewhere"}],
     "pending[0]: 'moved_to' must be a folder under history/"),
])
def test_a_hand_broken_pending_note_is_one_line_naming_it(r3, tmp_path, pending, named):
    out = tmp_path / "out"
    assert _run(r3, "oneshot", "--out", out, "--only", "x", "--device", "cpu").returncode == 0
    path = out / "testrun" / "manifest.json"
    data = json.loads(path.read_text())
    data["pending"] = pending
    path.write_text(json.dumps(data))
    for args in (("stage", "x", "--out", out, "--device", "cpu"), ("report", "testrun", "--out", out)):
        r = _run(r3, *args)
        assert r.returncode == 2, (args, r.stderr)
        assert named in r.stderr and "unexpected" not in r.stderr and "Traceback" not in r.stderr
    assert (out / "testrun" / "x.txt").read_text() == "v1"
