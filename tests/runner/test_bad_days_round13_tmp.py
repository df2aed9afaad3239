"""Bad days, red-team round 13 (part A) B3, through the CLI: the temp folder (TMPDIR) out of inodes
or space while plugins are discovered.

Before the fix, ``nsa-run list`` / ``stage`` / ``oneshot`` with TMPDIR on a tmpfs of 2 or 3 inodes
ended ``error: OSError: [Errno 28] ... (unexpected: rerun with --debug ...)`` (the discovery folder's
marker or ``child.log``); with 4 inodes the discovery child could not create its result file and
was reported as a broken plugin (``invalid:invalid_discovery ... exit code 1``), so ``stage a``
said ``unknown stage 'a'``. A plugin whose (large) description no longer fits the full temp folder
was blamed for "exit code 1" too. Expected: one line naming the temp folder and that it is full,
exit 2, a hint (free space, or set TMPDIR to another folder); no plugin blamed.

The tests mount small tmpfs folders, so they need root (they skip otherwise).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

try:
    from _bad_days import MAIN
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN


STAGES = """
import os
from nsa_runner import Stage, StageResult, Status

class A(Stage):
    name, order, timeout_s = "a", 15, 120.0
    description = "d" * int(os.environ.get("R13T_DESC", "10"))
    def run(self, ctx):
        (ctx.dir / "a.txt").write_text("a")
        return StageResult(Status.PASS, "a ok", files=["a.txt"])

if os.environ.get("R13T_FILL"):  # fill the temp folder's bytes while this plugin is imported
    import tempfile
    try:
        with open(os.path.join(tempfile.gettempdir(), "fill"), "wb") as f:
            while True:
                f.write(b"x" * 4096)
                f.flush()
    except OSError:
        pass
"""


@pytest.fixture
def tmpfs(tmp_path):
    """A factory of small tmpfs folders (unmounted at the end)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = []

    def mount(opts: str):
        where = tmp_path / f"t-{uuid.uuid4().hex[:8]}"
        where.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs: {r.stderr.decode(errors='replace').strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture
def a_env(plugins):
    plugins.make("r13t-plugin", "r13t_mod", STAGES, {"a": "r13t_mod:A"})
    env = plugins.env()
    for k in ("R13T_DESC", "R13T_FILL", "NSA_RUN_DEBUG"):
        env.pop(k, None)
    return env


def _run(env, tmpdir, *args):
    env = dict(env, TMPDIR=str(tmpdir), NSA_RUN_SPARE_WORKER=env.get("NSA_RUN_SPARE_WORKER", "1"))
    return subprocess.run([sys.executable, "-c", MAIN, *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=180)


def _says_temp_full(r, tmpdir, how=("inodes",)) -> None:
    err = r.stderr
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], err[-2000:])
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines and lines[0].startswith("error: "), err
    first = lines[0]
    assert str(tmpdir) in first, err  # the full temp folder, named
    assert "full" in first and any(h in first for h in how), err
    assert "unexpected" not in err and "Traceback" not in err, err
    assert "unknown stage" not in err and "invalid" not in err and "exit code" not in err, err
    assert "TMPDIR" in err, err  # the hint: free space there or set TMPDIR elsewhere


@pytest.mark.parametrize("inodes", [2, 3, 4])
def test_b3_list_stage_oneshot_with_a_temp_folder_out_of_inodes_say_so(tmpfs, a_env, tmp_path, inodes):
    tmpdir = tmpfs(f"size=4m,nr_inodes={inodes}")
    _says_temp_full(_run(a_env, tmpdir, "list"), tmpdir)
    _says_temp_full(_run(a_env, tmpdir, "stage", "a", "--out", tmp_path / "o1", "--device", "cpu"), tmpdir)
    _says_temp_full(_run(a_env, tmpdir, "oneshot", "--only", "a", "--out", tmp_path / "o2", "--device", "cpu"),
                    tmpdir)
    assert os.listdir(tmpdir) == []  # nothing left in it


def test_b3_temp_folder_filled_while_a_plugin_is_imported_is_not_blamed_on_the_plugin(tmpfs, a_env, tmp_path):
    tmpdir = tmpfs("size=256k")
    env = dict(a_env, R13T_FILL="1", R13T_DESC="20000")  # its record no longer fits the full folder
    r = _run(env, tmpdir, "list")
    _says_temp_full(r, tmpdir, how=("space", "inodes"))
    assert "r13t" not in r.stderr


def test_b3_a_plain_small_temp_folder_still_works(tmpfs, a_env, tmp_path):
    """The control: a temp folder with enough room runs the stage."""
    tmpdir = tmpfs("size=4m,nr_inodes=64")
    r = _run(a_env, tmpdir, "stage", "a", "--out", tmp_path / "o", "--device", "cpu")
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert "PASS" in r.stdout


@pytest.mark.parametrize("inodes", range(5, 12))
def test_b3_after_discovery_a_full_temp_folder_is_named_never_the_disk(tmpfs, a_env, tmp_path, inodes):
    """Past discovery, a stage's temp files (its folder, marker, job, the worker's result) and the
    spare's folder need inodes too: before the executor's part of the fix, 6-9 inodes ended
    'run X is incomplete: No space left on device' (the run folder's disk blamed) or the stage
    ERROR 'exited with code 1 without a result'. Now the temp folder is named, whichever step hit it."""
    tmpdir = tmpfs(f"size=4m,nr_inodes={inodes}")
    for spare in ("0", "1"):
        r = _run(dict(a_env, NSA_RUN_SPARE_WORKER=spare), tmpdir, "oneshot", "--only", "a", "--out",
                 tmp_path / f"o{spare}", "--device", "cpu")
        out = r.stdout + r.stderr
        assert "Traceback" not in r.stderr and "unexpected" not in r.stderr, out[-3000:]
        if r.returncode == 0:  # enough room for this run: the control
            assert "1 passed" in out, out[-3000:]
            continue
        assert str(tmpdir) in out and "is full" in out, out[-3000:]
        assert "without a result" not in out, out[-3000:]
