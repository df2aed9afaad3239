"""Bad days, red-team round 11, part A (containment, reruns, process hygiene): what the probes from
outside broke (docs/reliability.md, "Red-team round 11"), each through the real CLI.

- A-R1: a rerun's put-back passed over a name the interrupted attempt left as a FIFO, a dangling
  link or a device node (also a FIFO ``logs/a.log``, a declared folder turned into a link out),
  cleared ``pending``, and the manifest kept ``a PASS [a.txt]`` while v1 lay unrecorded in history/;
- A-R4: an attempt that replaced the declared folder ``d`` (of ``d/x.txt``) by a plain file and got
  SIGTERM exited 2 "incomplete: File exists" (not 130), and every later ``stage b`` exited 2;
- A-R5: a stage that SIGSTOPped its own watchdog left it stopped for good when nsa-run got SIGTERM
  while waiting for it (and the stage's PASS was not recorded);
- A-R2: a declared name that is not UTF-8 text (``a\\udcff.txt``) PASSed, and broke report.html.

Stage ``a`` runs ``$RT_A_CMD`` (a shell command) in the run folder, writes ``a.txt`` ($RT_A_TEXT)
unless ``$RT_A_NOWRITE``, notes its pid in ``$RT_A_MARK``, sleeps ``$RT_A_SLEEP`` and declares
``$RT_A_FILES`` (a Python literal list; default ``["a.txt"]``); stage ``b`` writes and declares b.txt.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

try:
    from _bad_days import MAIN, alive, env_with, gone_within, wait_for
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, alive, env_with, gone_within, wait_for

# the nsa-run script itself (cli.main: what a terminal or CI job runs), run id pinned

RT = """
import ast, os, signal, subprocess, time
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

def _stop_my_watchdog():
    import psutil
    worker = os.getppid()  # the stage runs in a child of the worker process (_worker.keep_orphans)
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "--watchdog" in cmd and str(worker) in cmd:
            p.send_signal(signal.SIGSTOP)
            return p.pid
    return 0

class A(Stage):
    name, order, timeout_s = "a", 10, 120.0
    def run(self, ctx):
        text = os.environ.get("RT_A_TEXT", "v1")
        if not os.environ.get("RT_A_NOWRITE"):
            (ctx.dir / "a.txt").write_text(text)
        if os.environ.get("RT_A_CMD"):
            subprocess.run(os.environ["RT_A_CMD"], shell=True, cwd=ctx.dir)
        print(f"a wrote {text}", flush=True)
        mark = os.environ.get("RT_A_MARK")
        if mark:
            pid = _stop_my_watchdog() if os.environ.get("RT_A_STOP_WATCHDOG") else os.getpid()
            Path(mark).write_text(str(pid))
        time.sleep(float(os.environ.get("RT_A_SLEEP", "0")))
        files = ast.literal_eval(os.environ["RT_A_FILES"]) if os.environ.get("RT_A_FILES") else ["a.txt"]
        return StageResult(Status.PASS, f"a {text}", files=files)

class B(Stage):
    name, order, timeout_s = "b", 20, 120.0
    def run(self, ctx):
        (ctx.dir / "b.txt").write_text("b")
        return StageResult(Status.PASS, "b", files=["b.txt"])
"""


@pytest.fixture
def rt(plugins):
    plugins.make("rt-plugin", "rt_mod", RT, {"a": "rt_mod:A", "b": "rt_mod:B"})
    env = plugins.env()
    for k in [k for k in env if k.startswith("RT_A_")]:
        env.pop(k)
    return env


def main_cmd(*args) -> list[str]:
    return [sys.executable, "-c", MAIN, *map(str, args)]


def _main(env, *args, timeout=120):
    return subprocess.run(main_cmd(*args), env=env, text=True, timeout=timeout, capture_output=True)


def _manifest(run) -> dict:
    return json.loads((run / "manifest.json").read_text())


def _first(env, out, **kw):
    r = _main(env_with(env, **kw), "stage", "a", "--out", out, "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    return out / "testrun"


def _start_attempt(env, out, tmp_path, spawn, **kw):
    """``stage a`` again, stopped (by the caller) while it sleeps after ``$RT_A_CMD`` ran."""
    mark = tmp_path / "attempt.started"
    proc = spawn(main_cmd("stage", "a", "--out", out, "--device", "cpu"),
                 env=env_with(env, RT_A_TEXT="v2", RT_A_MARK=mark, RT_A_SLEEP=60, **kw),
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(mark, proc=proc)
    spawn.snapshot()
    return proc


def _back(run, rel="a.txt", text="v1"):
    """The earlier result is back in place and recorded, nothing left pending."""
    m = _manifest(run)
    (a,) = [s for s in m["stages"] if s["name"] == "a"]
    assert a["status"] == "PASS" and a["reason"] == f"a {text}", a
    p = run / rel
    assert stat.S_ISREG(os.lstat(p).st_mode) and p.read_text() == text, os.lstat(p)
    assert not m.get("pending"), m.get("pending")
    assert not [q for q in (run / "history").rglob(os.path.basename(rel)) if q.is_file() and q.read_text() == text], \
        "the earlier result still lies in history/"
    return m


def _left_in(run, rel, kind):
    """What the attempt left at ``rel`` went to its history folder (kept, never followed)."""
    found = [h / rel for h in (run / "history").iterdir() if h.name.startswith("a-")]  # glob skips a dangling link
    found = [q for q in found if os.path.lexists(q) and kind(os.lstat(q).st_mode)]
    assert found, sorted(str(q.relative_to(run)) for q in (run / "history").rglob("*"))


LEFTOVERS = {
    "fifo": ("rm a.txt; mkfifo a.txt", stat.S_ISFIFO),
    "dangling link": ("rm a.txt; ln -s /nonexistent/nsa-rt/a.txt a.txt", stat.S_ISLNK),
    "device node": ("rm a.txt; mknod a.txt c 1 3", stat.S_ISCHR),
}


def _can_mknod(tmp_path) -> bool:
    try:
        os.mknod(tmp_path / "probe.dev", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        return True
    except (OSError, AttributeError):
        return False


@pytest.mark.parametrize("how", ["sigterm", "kill -9"])
@pytest.mark.parametrize("what", list(LEFTOVERS))
def test_a_put_back_moves_a_fifo_link_or_device_the_attempt_left_out_of_the_way(rt, tmp_path, spawn, what, how):
    """A-R1: the put-back moved regular files and folders only: a FIFO, a dangling link or a device
    node at a.txt was passed over, v1 stayed unrecorded in history/ and `pending` was cleared."""
    cmd, kind = LEFTOVERS[what]
    if what == "device node" and not _can_mknod(tmp_path):
        pytest.skip("mknod is not allowed here")
    out = tmp_path / "out"
    run = _first(rt, out)
    proc = _start_attempt(rt, out, tmp_path, spawn, RT_A_CMD=cmd, RT_A_NOWRITE=1)
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err[-2000:]
    else:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        time.sleep(0.5)
        r = _main(rt, "stage", "b", "--out", out, "--device", "cpu")
        assert r.returncode == 0, r.stderr[-2000:]
    _back(run)
    _left_in(run, "a.txt", kind)


def test_a_put_back_replaces_a_fifo_log_the_attempt_left(rt, tmp_path, spawn):
    """A-R1: logs/a.log swapped for a FIFO by the attempt: the earlier log never came back."""
    out = tmp_path / "out"
    run = _first(rt, out)
    proc = _start_attempt(rt, out, tmp_path, spawn, RT_A_CMD="rm logs/a.log; mkfifo logs/a.log")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    m = _manifest(run)
    assert not m.get("pending")
    log = run / "logs" / "a.log"
    assert stat.S_ISREG(os.lstat(log).st_mode) and "a wrote v1" in log.read_text()
    _left_in(run, "logs/a.log", stat.S_ISFIFO)


@pytest.mark.parametrize("victim", [False, True])
def test_a_put_back_never_follows_a_declared_folder_turned_into_a_link_out(rt, tmp_path, spawn, victim):
    """A-R1: declared d/x.txt, the attempt made d a link to a folder outside the run: v1 was either
    passed over (a victim x.txt there) or moved out of the run folder through the link."""
    out = tmp_path / "out"
    outside = tmp_path / "outside"
    outside.mkdir()
    if victim:
        (outside / "x.txt").write_text("victim")
    files = "['a.txt', 'd/x.txt']"
    run = _first(rt, out, RT_A_CMD="mkdir -p d && printf v1 > d/x.txt", RT_A_FILES=files)
    proc = _start_attempt(rt, out, tmp_path, spawn, RT_A_CMD=f"rm -rf d && ln -s {outside} d", RT_A_FILES=files)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    _back(run, "d/x.txt")
    assert not (run / "d").is_symlink()
    assert sorted(p.name for p in outside.iterdir()) == (["x.txt"] if victim else [])
    if victim:
        assert (outside / "x.txt").read_text() == "victim"
    _left_in(run, "d", stat.S_ISLNK)


@pytest.mark.parametrize("how", ["sigterm", "kill -9"])
def test_a_put_back_replaces_a_file_the_attempt_left_where_a_declared_folder_was(rt, tmp_path, spawn, how):
    """A-R4: the attempt replaced declared folder d (of d/x.txt) by a plain file d: SIGTERM exited 2
    "incomplete: File exists" with a disk-space hint, and every later `stage b` exited 2."""
    out = tmp_path / "out"
    files = "['a.txt', 'd/x.txt']"
    run = _first(rt, out, RT_A_CMD="mkdir -p d && printf v1 > d/x.txt", RT_A_FILES=files)
    proc = _start_attempt(rt, out, tmp_path, spawn, RT_A_CMD="rm -rf d && echo junk > d", RT_A_FILES=files)
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err[-2000:]
        assert "File exists" not in err and "free some space" not in err, err[-2000:]
    else:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        time.sleep(0.5)
    for _ in range(2):  # a later stage b runs, and so does the one after it
        r = _main(rt, "stage", "b", "--out", out, "--device", "cpu")
        assert r.returncode == 0, r.stderr[-2000:]
    _back(run, "d/x.txt")
    _left_in(run, "d", stat.S_ISREG)


def test_a_put_back_that_cannot_finish_names_what_and_keeps_pending(rt, tmp_path, spawn):
    """A-R1 / A-R4: when a name cannot be put back (here the attempt left a folder that another
    stage's entry now claims, by a hand edit), the put-back says what and where, and `pending` keeps
    the move (nothing cleared while something is not back)."""
    out = tmp_path / "out"
    files = "['a.txt', 'd/x.txt']"
    run = _first(rt, out, RT_A_CMD="mkdir -p d && printf v1 > d/x.txt", RT_A_FILES=files)
    assert _main(rt, "stage", "b", "--out", out, "--device", "cpu").returncode == 0
    proc = _start_attempt(rt, out, tmp_path, spawn, RT_A_CMD="rm -rf d && echo junk > d", RT_A_FILES=files)
    # by hand, under the run folder's lock as any nsa-run writes (a change of manifest.json made without it
    # is undone by the runner: round 16 A3): stage b now lists `d` (the file the attempt left)
    from nsa_runner.manifest import RunManifest

    def b_lists_d(m):
        for s in m["stages"]:
            if s["name"] == "b":
                s["files"].append("d")

    RunManifest(run, _manifest(run)).update(b_lists_d)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    m = _manifest(run)
    assert [p["stage"] for p in m.get("pending") or []] == ["a"], m.get("pending")
    assert "d/x.txt" in err and m["pending"][0]["moved_to"] in err, err[-2000:]
    assert (run / m["pending"][0]["moved_to"] / "d" / "x.txt").read_text() == "v1"


def test_a_stopped_watchdog_is_never_left_behind_and_the_result_is_recorded(rt, tmp_path, spawn):
    """A-R5: stage a SIGSTOPs its own watchdog and PASSes; a SIGTERM to nsa-run while it waited for
    the watchdog exited 130 at once, leaving the watchdog stopped (state T) and a's result unrecorded."""
    out = tmp_path / "out"
    mark = tmp_path / "watchdog.pid"
    proc = spawn(main_cmd("stage", "a", "--out", out, "--device", "cpu"),
                 env=env_with(rt, RT_A_MARK=mark, RT_A_STOP_WATCHDOG=1, RT_A_SLEEP=0.2),
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    dog = int(wait_for(mark, proc=proc))
    assert dog > 0, "the stage found no watchdog to stop"
    time.sleep(2.0)  # the stage has returned; the runner waits for the watchdog
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    try:
        assert proc.returncode in (0, 130), err[-2000:]
        assert gone_within(dog, 10), "the stopped watchdog was left behind"
        m = _manifest(out / "testrun")
        assert [(s["name"], s["status"]) for s in m["stages"]] == [("a", "PASS")], m["stages"]
    finally:
        if alive(dog):
            os.kill(dog, signal.SIGKILL)
            os.kill(dog, signal.SIGCONT)


def test_a_declared_name_that_is_not_utf8_text_is_an_error_naming_it(rt, tmp_path):
    """A-R2: a declared 'a\\udcff.txt' (a file named with the byte 0xff) PASSed with exit 0; then
    report.html said the manifest could not be used (UnicodeEncodeError)."""
    out = tmp_path / "out"
    r = _main(env_with(rt, RT_A_CMD="printf x > \"$(printf 'a\\377.txt')\"", RT_A_FILES="['a.txt', 'a\\udcff.txt']"),
              "stage", "a", "--out", out, "--device", "cpu")
    assert r.returncode == 1, r.stderr[-2000:]
    run = out / "testrun"
    (a,) = _manifest(run)["stages"]
    assert a["status"] == "ERROR" and a["files"] == ["a.txt"], a
    assert "a\\udcff.txt" in a["reason"] and "UTF-8" in a["reason"], a["reason"]
    r = _main(rt, "stage", "b", "--out", out, "--device", "cpu")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    r = _main(rt, "report", run)
    assert "Traceback" not in r.stderr and "UnicodeEncodeError" not in r.stderr + r.stdout, r.stderr[-2000:]
    html = (run / "report.html").read_text()
    assert "UnicodeEncodeError" not in html and "cannot be used" not in html
