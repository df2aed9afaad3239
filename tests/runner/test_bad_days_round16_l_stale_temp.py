"""Bad days, red-team round 16 (part A) A11, through the CLI: ``clean_stale`` (every run command's start,
over the whole ``$TMPDIR``) judged a temp folder ``nsa-run-<stage>-<pid>-*`` / ``nsa-run-spare-<pid>-*``
by its pid alone. An nsa-run in another PID namespace sharing ``$TMPDIR`` (a container sharing /tmp,
``unshare -p``), with another ``--out``, saw that pid as gone and removed the temp folders of a run in
progress: its stage ended ERROR "nsa-run's temp folder of the stage ... was removed while the stage ran".

Expected: a temp folder's maker is judged by a lock it holds on the folder's marker (flock: held for as
long as it lives, whatever its PID namespace), never by its pid alone; a folder whose maker is gone
(lock free, pid not running) is still removed.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN, dead_pid, env_with, wait_for
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, dead_pid, env_with, wait_for

WAITER = """
import os, time
from pathlib import Path
from nsa_runner import Stage, StageResult, Status
class W(Stage):
    name, order, timeout_s = "lwait", 16, 300.0
    def run(self, ctx):
        Path(os.environ["R16L_MARK"]).write_text("x")
        go = Path(os.environ["R16L_GO"])
        for _ in range(6000):  # until the test says so (at most 5 minutes)
            if go.exists():
                break
            time.sleep(0.05)
        (ctx.dir / "lwait.txt").write_text("w")
        return StageResult(Status.PASS, "waited", files=["lwait.txt"])
class Q(Stage):
    name, order = "lquick", 17
    def run(self, ctx): return StageResult(Status.PASS, "quick")
"""


def _cli(env, *args, prefix=()):
    return subprocess.run([*prefix, sys.executable, "-c", MAIN, *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=300)


def _unshare_prefix() -> list[str] | None:
    """A command prefix that runs a process in a new PID namespace (root: ``unshare -pf``; else a user
    namespace too), or None where this machine allows neither (an unprivileged CI container)."""
    exe = shutil.which("unshare")
    if exe is None:
        return None
    for flags in (["-pf", "--mount-proc"], ["-Urpf", "--mount-proc"]):
        try:
            r = subprocess.run([exe, *flags, "true"], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0:
            return [exe, *flags]
    return None


def _temp_folders(tmp) -> set[str]:
    return {p.name for p in tmp.iterdir() if p.name.startswith("nsa-run-") and p.is_dir()}


def test_a11_a_run_in_another_pid_namespace_leaves_a_live_runs_temp_folders_alone(plugins, tmp_path):
    prefix = _unshare_prefix()
    if prefix is None:
        pytest.skip("no PID namespace can be made here (unshare -p needs root or user namespaces); "
                    "test_a11_a_folder_whose_marker_lock_is_held_is_kept covers the same rule without one")
    plugins.make("r16l-wait", "r16l_wait_mod", WAITER, {"lwait": "r16l_wait_mod:W", "lquick": "r16l_wait_mod:Q"})
    tmp, mark, go = tmp_path / "tmp", tmp_path / "mark", tmp_path / "go"
    tmp.mkdir()
    env = env_with(plugins.env(), TMPDIR=str(tmp), R16L_MARK=str(mark), R16L_GO=str(go))
    run = subprocess.Popen([sys.executable, "-c", MAIN, "oneshot", "--only", "lwait,lquick", "--out",
                            tmp_path / "out", "--device", "cpu"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        wait_for(mark, proc=run)
        live = _temp_folders(tmp)
        assert any(n.startswith("nsa-run-lwait-") for n in live), live
        # another nsa-run, in a PID namespace of its own, sharing $TMPDIR, another --out
        other = _cli(env, "stage", "lquick", "--out", tmp_path / "out2", "--device", "cpu", prefix=prefix)
        assert other.returncode == 0, other.stderr[-3000:]
        assert live <= _temp_folders(tmp), (live, _temp_folders(tmp))  # nothing of the live run removed
    finally:
        go.write_text("go")
        out, err = run.communicate(timeout=300)
    assert run.returncode == 0, (out[-3000:], err[-3000:])
    assert "removed while the stage ran" not in out + err


def test_a11_a_folder_whose_marker_lock_is_held_is_kept(plugins, tmp_path):
    """The same rule without a PID namespace: a marked temp folder whose recorded pid runs nowhere here,
    while its marker's lock is held (its maker lives, e.g. in another PID namespace), is kept by a run
    command's start; once the lock is let go, the next run command removes it."""
    plugins.make("r16l-wait", "r16l_wait_mod", WAITER, {"lwait": "r16l_wait_mod:W", "lquick": "r16l_wait_mod:Q"})
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    pid = dead_pid()
    folder = tmp / f"nsa-run-lwait-{pid}-abcd1234"
    folder.mkdir()
    (folder / "job.pkl").write_bytes(b"x")
    marker = folder / ".nsa-run-owned"
    marker.write_text(f"{pid}\n")  # what nsa-run writes into a temp folder it makes
    env = env_with(plugins.env(), TMPDIR=str(tmp), NSA_RUN_SPARE_WORKER="0")
    fd = os.open(marker, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # its maker, alive (in another PID namespace)
        r = _cli(env, "stage", "lquick", "--out", tmp_path / "out", "--device", "cpu")
        assert r.returncode == 0, r.stderr[-3000:]
        assert folder.is_dir() and (folder / "job.pkl").exists()  # kept: its maker holds the lock
    finally:
        os.close(fd)
    r = _cli(env, "stage", "lquick", "--out", tmp_path / "out", "--device", "cpu")
    assert r.returncode == 0, r.stderr[-3000:]
    assert not folder.exists()  # its maker gone (lock free, pid not running): removed
    assert not _temp_folders(tmp), _temp_folders(tmp)
