"""Round 15 A2 (for manifest.record / artifacts.declared_type_problem): a stage's declared file that is
a FIFO, a character device, a bound Unix socket, or a (sparse) regular file over the readers' 256 MiB
limit passed the record-time check: the stage PASSed, rc 0, report.html was not written ("expected a
file" / "more than the 256 MiB this reader accepts"), and every later ``report`` / ``compare`` of the
run exited 2 for good. Now such a name is refused by type and size when the result is recorded (never
opened): the stage is ERROR naming the file and what it is, the name is not recorded, the run goes on,
report.html is written and ``report`` / ``compare`` of the run work. Through the CLI (run id pinned)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

try:
    from _bad_days import PINNED, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import PINNED, env_with

RT = """
import os, socket
from nsa_runner import Stage, StageResult, Status

TABLE = "case,status,ms\\nc1,PASS,1.0\\n"

class A(Stage):
    name, order, timeout_s = "a", 10, 120.0
    def run(self, ctx):
        os.chdir(ctx.dir)  # a socket's address is short: bound by its relative name
        kind = os.environ.get("RT15S_KIND", "")
        if kind == "fifo":
            os.mkfifo("a.csv")
        elif kind == "socket":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind("a.csv")
        elif kind == "chardev":  # /dev/zero made again inside the run folder
            os.mknod("a.csv", 0o20644, os.makedev(1, 5))
        elif kind == "chardev-link":  # a link inside the run folder to such a device inside it
            os.mkdir("dev")
            os.mknod("dev/zero", 0o20644, os.makedev(1, 5))
            os.symlink("dev/zero", "a.csv")
        elif kind == "sparse":  # 300 MiB, no real disk use
            with open("a.csv", "w") as f:
                f.write(TABLE)
                f.truncate(300 << 20)
        else:
            with open("a.csv", "w") as f:
                f.write(TABLE)
        os.makedirs("d", exist_ok=True)
        with open("d/x.txt", "w") as f:
            f.write("x")
        return StageResult(Status.PASS, "a", files=["a.csv", "d"])

class B(Stage):
    name, order, timeout_s = "b", 11, 120.0
    def run(self, ctx):
        (ctx.dir / "b.txt").write_text("b")
        return StageResult(Status.PASS, "b", files=["b.txt"])
"""


def _mknod_works(tmp_path) -> bool:
    try:
        os.mknod(tmp_path / "probe", 0o20644, os.makedev(1, 5))
    except OSError:
        return False
    os.remove(tmp_path / "probe")
    return True


@pytest.fixture
def rt(plugins):
    plugins.make("rt15s-special-plugin", "rt15s_special_mod", RT, {"a": "rt15s_special_mod:A",
                                                                    "b": "rt15s_special_mod:B"})
    env = plugins.env()
    env["NSA_RUN_SPARE_WORKER"] = "0"
    return env


def _nsa(env, *args, **kw):
    return subprocess.run([sys.executable, "-c", PINNED, *map(str, args)], env=env_with(env, **kw), text=True,
                          capture_output=True, timeout=300)


def _stage(folder, name) -> dict:
    m = json.loads((folder / "manifest.json").read_text())
    return next(s for s in m["stages"] if s["name"] == name)


KINDS = {"fifo": "a FIFO", "socket": "a socket", "chardev": "a character device",
         "chardev-link": "a character device", "sparse": "300 MiB"}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a2_a_declared_special_or_oversize_file_is_the_stages_error_and_the_run_stays_readable(rt, tmp_path, kind):
    if kind.startswith("chardev") and not _mknod_works(tmp_path):
        pytest.skip("mknod of a character device is not allowed here")
    out = tmp_path / "out"
    first = _nsa(rt, "oneshot", "--only", "a,b", "--out", out, "--device", "cpu")  # a regular a.csv: testrun
    assert first.returncode == 0, (first.returncode, first.stderr[-2000:])
    r = _nsa(rt, "oneshot", "--only", "a,b", "--out", out, "--device", "cpu", RT15S_KIND=kind)
    assert r.returncode == 1, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    run = out / "testrun.2"
    a = _stage(run, "a")
    assert a["status"] == "ERROR", a
    assert "a.csv" in a["reason"] and KINDS[kind] in a["reason"], a["reason"]
    assert a["files"] == ["d"], a["files"]  # the folder stays declared; the refused name is not recorded
    assert _stage(run, "b")["status"] == "PASS"  # the run went on
    assert "report not written" not in r.stdout + r.stderr, (r.stdout[-2000:], r.stderr[-2000:])
    assert (run / "report.html").is_file()
    # the terminal and --json agree with the manifest (the record object says the same)
    assert "ERROR" in r.stdout and "a.csv" in r.stdout, r.stdout[-2000:]

    rep = _nsa(rt, "report", run)
    assert rep.returncode == 0, (rep.returncode, rep.stdout[-2000:], rep.stderr[-2000:])
    cmp = _nsa(rt, "compare", "testrun", "testrun.2", "--out", out)
    # as for any stage newly ERROR: a regression (exit 1), the refused a.csv "not in B"
    assert cmp.returncode == 1, (cmp.returncode, cmp.stdout[-2000:], cmp.stderr[-2000:])
    assert "a.csv not in B" in cmp.stdout, cmp.stdout[-2000:]
    assert "Traceback" not in rep.stderr + cmp.stderr


def test_a2_regular_files_and_a_folder_still_pass(rt, tmp_path):
    out = tmp_path / "out"
    r = _nsa(rt, "oneshot", "--only", "a,b", "--out", out, "--device", "cpu")
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert _stage(out / "testrun", "a")["files"] == ["a.csv", "d"]
    assert _stage(out / "testrun", "a")["status"] == "PASS"
