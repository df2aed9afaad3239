"""Bad days, round 13 part A, B2 (containment / reruns): a rerun's attempt (plugin code) swapped the
run folder's ``history`` (or its set-aside folder ``history/a-<t>``) for a link to a folder outside
the run folder, then the runner got SIGTERM (or kill -9, and the next command put the earlier result
back). The put-back followed the link: a file outside the run folder was moved in and the attempt
was written outside, or, silently, the manifest said ``a PASS v1`` while ``a.txt`` held the
attempt's v2. Now a history (or set-aside folder) that is not a real folder of the run folder makes
the put-back refuse: one line names it, ``pending`` keeps the move, nothing crosses the run folder's
boundary, and the next command into the folder exits 2 naming it.

Also: ``_move_owned`` / ``_bring_back`` compared every declared file with every name of the other
stages (quadratic); they look names up now.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.runner._bad_days import cli_cmd, env_with, wait_for

SOURCE = """
import os, subprocess, time
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

def _act(ctx, name):
    text = os.environ.get("H13_TEXT", "v1")
    (ctx.dir / f"{name}.txt").write_text(text)
    print(f"{name} wrote {text}", flush=True)
    if os.environ.get("H13_CMD"):
        subprocess.run(os.environ["H13_CMD"], shell=True, cwd=ctx.dir, check=True)
    if os.environ.get("H13_MARK"):
        Path(os.environ["H13_MARK"]).write_text(str(os.getpid()))
    time.sleep(float(os.environ.get("H13_SLEEP", "0")))
    files = eval(os.environ.get("H13_FILES", "None")) or [f"{name}.txt"]
    return StageResult(Status.PASS, f"{name} {text}", files=files)

class A(Stage):
    name, order, timeout_s = "a", 10, 120.0
    def run(self, ctx):
        return _act(ctx, "a")

class B(Stage):
    name, order, timeout_s = "b", 20, 120.0
    def run(self, ctx):
        return _act(ctx, "b")
"""


@pytest.fixture
def h13(plugins):
    plugins.make("h13-plugin", "h13_mod", SOURCE, {"a": "h13_mod:A", "b": "h13_mod:B"})
    env = plugins.env()
    for k in [k for k in env if k.startswith("H13_")]:
        env.pop(k)
    return env


def _run(env, *args, timeout=120):
    return subprocess.run(cli_cmd(*args), env=env, text=True, timeout=timeout, capture_output=True)


def _stage(env, out, name="a", **kw):
    return _run(env_with(env, **kw), "stage", name, "--out", out, "--device", "cpu")


def _manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): (p.read_text() if p.is_file() else "<dir>")
            for p in sorted(folder.rglob("*"))}


def _rerun_stopped(env, out: Path, mark: Path, cmd: str, how: str, snap: Path | None = None):
    """Rerun stage a (v2) whose attempt runs ``cmd`` in the run folder, then SIGTERM (returns the
    finished process) or kill -9 (returns None) the runner once the attempt got that far; with
    ``snap``: also the tree of ``snap`` as the attempt left it (before the runner was stopped)."""
    p = subprocess.Popen(cli_cmd("stage", "a", "--out", out, "--device", "cpu"),
                         env=env_with(env, H13_TEXT="v2", H13_SLEEP=60, H13_MARK=mark, H13_CMD=cmd),
                         text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(mark, proc=p)
        time.sleep(0.3)
        before = _tree(snap) if snap is not None else None
        if how == "kill9":
            p.kill()
            p.communicate(timeout=60)
            stage_pid = int(mark.read_text())
            deadline = time.monotonic() + 30  # the watchdog ends the stage once the runner is gone
            while time.monotonic() < deadline:
                try:
                    os.kill(stage_pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)
            return None, before
        p.send_signal(signal.SIGTERM)
        out_, err = p.communicate(timeout=90)
        return subprocess.CompletedProcess(p.args, p.returncode, out_, err), before
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
@pytest.mark.parametrize("swap", ["history", "set_aside_folder"])
def test_b2_put_back_never_follows_a_history_link_out_of_the_run_folder(h13, tmp_path, swap, how):
    out = tmp_path / "out"
    run = out / "testrun"
    r = _stage(h13, out)
    assert r.returncode == 0, r.stderr[-2000:]
    outside = tmp_path / "outside"
    away = tmp_path / "away"
    outside.mkdir()
    away.mkdir()
    if swap == "history":
        # a look-alike of the set-aside folder outside, then history -> outside
        cmd = (f"cp -a history/. {outside}/ && for d in {outside}/a-*; do echo OUTSIDE > $d/a.txt; done; "
               f"mv history {away}/history && ln -s {outside} history")
    else:
        (outside / "logs").mkdir()
        (outside / "a.txt").write_text("OUTSIDE")
        cmd = f"for d in history/a-*; do mv $d {away}/ && ln -s {outside} $d; done"
    done, before = _rerun_stopped(h13, out, tmp_path / "mark", cmd, how, snap=outside)
    if done is not None:
        assert done.returncode == 130, (done.returncode, done.stderr[-2000:])
        assert "Traceback" not in done.stderr
        # one line names the link and says pending keeps the move
        line = [ln for ln in done.stderr.splitlines() if "could not" in ln and "put back" in ln]
        assert line and "link" in line[0] and "pending" in line[0], done.stderr[-2000:]
    else:
        nxt = _stage(h13, out, "b")
        assert nxt.returncode == 2, (nxt.returncode, nxt.stdout[-1000:], nxt.stderr[-2000:])
        assert "Traceback" not in nxt.stderr
        assert "history" in nxt.stderr and "link" in nxt.stderr, nxt.stderr[-2000:]
        assert not (run / "b.txt").exists()
    # nothing outside the run folder was moved, nor written
    assert _tree(outside) == before
    # never a record whose files are not the ones recorded: the move stays noted in pending
    m = _manifest(run)
    assert [p.get("stage") for p in m.get("pending", [])] == ["a"], m.get("pending")
    (a,) = [s for s in m["stages"] if s["name"] == "a"]
    assert a["reason"] == "a v1"
    assert "OUTSIDE" not in (run / "a.txt").read_text() if (run / "a.txt").exists() else True
    # the earlier result is not lost: it is where the attempt moved it
    saved = [p for p in away.rglob("a.txt")]
    assert saved and all(p.read_text() == "v1" for p in saved), _tree(away)

    if how == "sigterm":  # the next command into the folder refuses, naming the history link
        nxt = _stage(h13, out, "b")
        assert nxt.returncode == 2, (nxt.returncode, nxt.stderr[-2000:])
        assert "history" in nxt.stderr and "link" in nxt.stderr and "Traceback" not in nxt.stderr
        assert _tree(outside) == before

    # once the user puts the real folder back, the next command puts the earlier result back
    if swap == "history":
        (run / "history").unlink()
        os.rename(away / "history", run / "history")
    else:
        for d in (run / "history").glob("a-*"):
            if d.is_symlink():
                d.unlink()
                os.rename(away / d.name, d)
    r = _stage(h13, out, "b")
    assert r.returncode == 0, r.stderr[-2000:]
    m = _manifest(run)
    assert not m.get("pending"), m["pending"]
    assert (run / "a.txt").read_text() == "v1"
    assert _tree(outside) == before


def test_b14_put_back_with_many_declared_files_is_not_quadratic(h13, tmp_path):
    """A rerun of a stage with 3000 declared files beside another stage with 3000: set aside and put
    back (SIGTERM) within seconds (every pair of names was compared)."""
    out = tmp_path / "out"
    run = out / "testrun"
    n = 3000
    make = ("import pathlib; [pathlib.Path(f'{d}/f{i}').write_text('x') for d in ('da', 'db') "
            f"for i in range({n})]")
    (tmp_path / "mk.py").write_text(make)
    env = env_with(h13, H13_CMD=f"mkdir -p da db && python3 {tmp_path}/mk.py")
    r = _stage(env, out, "a", H13_FILES=f"['a.txt'] + [f'da/f{{i}}' for i in range({n})]")
    assert r.returncode == 0, r.stderr[-2000:]
    r = _stage(env, out, "b", H13_FILES=f"['b.txt'] + [f'db/f{{i}}' for i in range({n})]")
    assert r.returncode == 0, r.stderr[-2000:]
    t0 = time.monotonic()
    done, _ = _rerun_stopped(env_with(h13, H13_FILES=f"['a.txt'] + [f'da/f{{i}}' for i in range({n})]"),
                          out, tmp_path / "mark", "true", "sigterm")
    took = time.monotonic() - t0
    assert done.returncode == 130, done.stderr[-2000:]
    m = _manifest(run)
    assert not m.get("pending"), m["pending"]
    assert (run / "a.txt").read_text() == "v1" and len(list((run / "da").iterdir())) == n
    assert took < 30, took
