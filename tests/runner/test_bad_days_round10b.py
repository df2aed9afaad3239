"""Bad days, an independent red-team pass beside round 10 (issue 16): what it broke, each through the CLI.

Every test here reproduces a break of that pass (see docs/reliability.md, "Red-team round 10",
"Independent probes"), which worked on the code before its fix (checked on a ``git archive`` copy):

- B1: ``nsa-run stage X`` spun at 100% CPU forever, printing nothing, when ``<out>/<run-id>`` was a
  plain file or a dangling link (no run folder, and the only name tried was taken);
- B2: ``compare`` merged every row of a timing CSV without a key column into one (a 10x read
  regression in row 1 was "no regression"), and ``--save-baseline`` wrote figures keyed ``{}`` that
  ``--baseline`` then refused;
- B3: a manifest ``files`` entry outside the run folder (``../../x.csv``, an absolute path) was read
  by ``report`` / ``compare`` and its rows copied into report.html;
- B4: a ``stage X`` rerun on a disk out of inodes moved part of the earlier result into ``history/``
  and never put it back, while saying "earlier runs are untouched";
- B5: a stage declared another stage's file through an in-folder link (``self -> .``,
  ``self/a.txt``) and its rerun moved that file into its own history;
- B6: ``.manifest.lock`` a hard link to a file outside the run folder: the next ``stage`` /
  ``oneshot`` truncated that file to 0 bytes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN, env_with, make
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, make

# the nsa-run script itself (cli.main: what a terminal or CI job runs), run id pinned


def main_cmd(*args) -> list[str]:
    return [sys.executable, "-c", MAIN, *map(str, args)]


# stages a (writes a.txt, runs $R10B_A_PY) and b (runs $R10B_B_PY, writes b.txt and declares it and
# $R10B_B_FILES), each Python code run in the stage's process with the run folder as cwd
EXEC = """
import os
from nsa_runner import Stage, StageResult, Status

class A(Stage):
    name, order, timeout_s = "a", 15, 120.0
    def run(self, ctx):
        exec(os.environ.get("R10B_A_PY", ""), {"ctx": ctx, "os": os})
        (ctx.dir / "a.txt").write_text(os.environ.get("R10B_TEXT", "stage a's result"))
        return StageResult(Status.PASS, "ok", files=["a.txt"] + os.environ.get("R10B_A_FILES", "").split())

class B(Stage):
    name, order, timeout_s = "b", 16, 120.0
    def run(self, ctx):
        exec(os.environ.get("R10B_B_PY", ""), {"ctx": ctx, "os": os})
        (ctx.dir / "b.txt").write_text("b")
        return StageResult(Status.PASS, "ok", files=["b.txt"] + os.environ.get("R10B_B_FILES", "").split())
"""


@pytest.fixture
def bd(plugins):
    return make(plugins)


@pytest.fixture
def ab(plugins):
    plugins.make("r10b-plugin", "r10b_mod", EXEC, {"a": "r10b_mod:A", "b": "r10b_mod:B"})
    return plugins.env()


def _oneshot(env, out, only="a", **kw):
    r = _main(env_with(env, **kw), "oneshot", "--out", out, "--only", only, "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    return out / "testrun"


def _main(env, *args, timeout=90, **kw):
    return subprocess.run(main_cmd(*args), env=env, text=True, timeout=timeout, capture_output=True, **kw)


def _one_error_line(r, *names):
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "(unexpected" not in r.stderr, r.stderr[-2000:]
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and all(n in err[0] for n in names), r.stderr[-2000:]
    return err[0]


# ---- B1 -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("obstacle", ["file", "dangling link"])
def test_stage_passes_over_a_file_or_dangling_link_named_like_the_run_and_says_so(bd, tmp_path, obstacle):
    """`stage x` with <out>/testrun a user's file (or a link to nowhere) busy-looped forever: the only
    name it tried was taken, and "taken" was read as "another nsa-run made it: open that one"."""
    out = tmp_path / "o"
    out.mkdir()
    where = out / "testrun"
    nowhere = tmp_path / "nowhere"
    if obstacle == "file":
        where.write_text("my notes\n")
    else:
        where.symlink_to(nowhere)
    try:
        r = _main(bd, "stage", "x", "--out", out, "--device", "cpu", timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("nsa-run stage x still ran after 30 s (it spins when <out>/<run-id> is no folder)")
    assert r.returncode == 0, r.stderr[-2000:]
    # like oneshot: the name is passed over, the run goes to testrun.2, and one line says why
    assert (out / "testrun.2" / "x.txt").read_text() == "v1"
    notes = [ln for ln in r.stderr.splitlines() if ln.startswith("note:") and "passed over" in ln]
    assert len(notes) == 1 and str(where) in notes[0] and "testrun.2" in notes[0], r.stderr[-2000:]
    if obstacle == "file":
        assert where.read_text() == "my notes\n"
    else:
        assert where.is_symlink() and not nowhere.exists()
    # the next `stage` goes to the same (latest) folder
    r = _main(bd, "stage", "y", "--out", out, "--device", "cpu", timeout=30)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (out / "testrun.2" / "y.txt").exists() and not (out / "testrun.3").exists()


# ---- B6 -------------------------------------------------------------------------------------------


def test_a_hard_linked_lock_file_is_refused_and_the_file_it_shares_is_untouched(ab, tmp_path):
    """`.manifest.lock` replaced by a hard link to a file outside the run folder: the next `stage`
    truncated that file to 0 bytes (filelock truncates the lock file once it holds it; O_NOFOLLOW
    stops a symlink, not a hard link), rc 0 without a word. The same when a stage made the link."""
    out = tmp_path / "o"
    folder = _oneshot(ab, out)
    victim = tmp_path / "victim.txt"
    victim.write_text("IMPORTANT USER DATA\n")
    lock = folder / ".manifest.lock"
    lock.unlink()
    lock.hardlink_to(victim)
    before = (folder / "manifest.json").read_text()
    line = _one_error_line(_main(ab, "stage", "a", "--out", out, "--device", "cpu"), str(lock), "hard link")
    assert "remove it" in line
    assert victim.read_text() == "IMPORTANT USER DATA\n"
    assert (folder / "manifest.json").read_text() == before and (folder / "a.txt").read_text() == "stage a's result"
    # made by a stage during a oneshot: the next manifest change refuses it
    victim2 = tmp_path / "victim2.txt"
    victim2.write_text("MORE USER DATA\n")
    code = f"os.remove('.manifest.lock'); os.link({str(victim2)!r}, '.manifest.lock')"
    r = _main(env_with(ab, R10B_A_PY=code), "oneshot", "--out", out, "--only", "a", "--device", "cpu")
    _one_error_line(r, ".manifest.lock", "hard link")
    assert victim2.read_text() == "MORE USER DATA\n"


def test_the_run_lock_never_truncates_a_lock_file_with_two_names(tmp_path):
    """The check on the locked descriptor itself (no window between a check and filelock's open):
    a lock file that is a hard link when locked is released untouched, never truncated."""
    from nsa_runner import manifest as mf

    victim = tmp_path / "victim"
    victim.write_text("DATA")
    lock = tmp_path / ".manifest.lock"
    lock.hardlink_to(victim)
    with pytest.raises((mf.UnsafeLockFile, mf.ManifestError)):
        mf._RunLock(str(lock)).acquire(timeout=1)
    assert victim.read_text() == "DATA"
    with pytest.raises(mf.ManifestError, match="hard link"):
        mf._acquire(mf._RunLock(str(lock)), 1, lock)
    assert victim.read_text() == "DATA"
    lock.unlink()  # a lock file of its own is locked as before
    held = mf._RunLock(str(lock))
    mf._acquire(held, 1, lock)
    held.release()


# ---- B3 -------------------------------------------------------------------------------------------

SECRET = "case,status,reads_x\nsecret-row,PASS,123456\n"
T_CSV = "open('t.csv', 'w').write('case,status,reads_x\\nc1,PASS,10\\n')"


@pytest.mark.parametrize("how", ["climbs", "absolute", "link"])
def test_a_manifest_entry_outside_the_run_folder_is_named_and_never_read(ab, tmp_path, how):
    """A hand-edited manifest `files` entry `../../secret.csv` or `/abs/secret.csv` (or a declared
    CSV later replaced by a link out) was read by `report` (its rows in report.html), `compare` and
    `compare --json`: the readers joined any name to the run folder."""
    out = tmp_path / "o"
    folder = _oneshot(ab, out, R10B_A_PY=T_CSV, R10B_A_FILES="t.csv")
    secret = tmp_path / "secret.csv"
    secret.write_text(SECRET)
    path = folder / "manifest.json"
    if how == "link":
        name = "t.csv"
        (folder / "t.csv").unlink()
        (folder / "t.csv").symlink_to(secret)
    else:
        name = "../../secret.csv" if how == "climbs" else str(secret)
        m = json.loads(path.read_text())
        m["stages"][0]["files"] = ["a.txt", "t.csv", name]
        path.write_text(json.dumps(m))
    line = _one_error_line(_main(ab, "report", folder), name, "outside the run folder")
    assert "not read" in line
    assert "secret-row" not in (folder / "report.html").read_text()  # the one the oneshot wrote stays
    for args in (("compare", folder, folder, "--all"), ("compare", folder, folder, "--json"),
                 ("compare", folder, "--save-baseline", tmp_path / "bl.json")):
        r = _main(ab, *args)
        _one_error_line(r, name, "outside the run folder")
        assert "secret" not in r.stdout and "123456" not in r.stdout + r.stderr
    assert not (tmp_path / "bl.json").exists()
    # the run's own junit.xml (refreshed by the next `stage`) never holds the outside file's cases
    r = _main(ab, "stage", "b", "--out", out, "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "secret-row" not in (folder / "junit.xml").read_text()
    assert secret.read_text() == SECRET


# ---- B5 -------------------------------------------------------------------------------------------


def test_a_stage_cannot_take_another_stages_file_through_a_folder_link(ab, tmp_path):
    """Stage b made `self -> .` and declared `self/a.txt` (stage a's a.txt): accepted (names were
    compared as text), and b's rerun moved a.txt into history/b-…/self/a.txt, a still PASS."""
    out = tmp_path / "o"
    r = _main(env_with(ab, R10B_B_PY="os.symlink('.', ctx.dir / 'self')", R10B_B_FILES="self/a.txt"),
              "oneshot", "--out", out, "--only", "a,b", "--device", "cpu")
    assert r.returncode == 1, r.stderr[-2000:]
    folder = out / "testrun"
    b = {s["name"]: s for s in json.loads((folder / "manifest.json").read_text())["stages"]}["b"]
    assert b["status"] == "ERROR" and b["files"] == ["b.txt"], b
    assert "self/a.txt (stage a: a.txt)" in b["reason"], b["reason"]
    # a rerun of b (declaring only b.txt now) leaves stage a's result where it is
    r = _main(ab, "stage", "b", "--out", out, "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (folder / "a.txt").read_text() == "stage a's result"
    assert not list((folder / "history").rglob("a.txt"))


def test_a_rerun_never_moves_another_stages_file_a_manifest_lists_through_a_link(ab, tmp_path):
    """The same as recorded by an older nsa-run (b's entry listing `self/a.txt`): b's rerun moved
    a.txt (the rerun's "another stage's file" check compared the names as text)."""
    out = tmp_path / "o"
    folder = _oneshot(ab, out, only="a,b", R10B_B_PY="os.symlink('.', ctx.dir / 'self')")
    path = folder / "manifest.json"
    m = json.loads(path.read_text())
    next(s for s in m["stages"] if s["name"] == "b")["files"] = ["b.txt", "self/a.txt"]
    path.write_text(json.dumps(m))
    r = _main(ab, "stage", "b", "--out", out, "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (folder / "a.txt").read_text() == "stage a's result"
    assert not list((folder / "history").rglob("a.txt"))
    assert list((folder / "history").rglob("b.txt"))  # b's own file did move


# ---- B2 -------------------------------------------------------------------------------------------

WRITE_T = "open('t.csv', 'w').write(os.environ['R10B_T'])"


@pytest.mark.parametrize("before, after", [("reads_x\n10\n10\n", "reads_x\n99\n10\n"),
                                           ("scale,reads_x\n0.5,10\n1.5,10\n", "scale,reads_x\n0.5,99\n1.5,10\n")],
                         ids=["no key column", "only a float key column"])
def test_a_timing_table_without_a_key_column_keeps_every_row(ab, tmp_path, before, after):
    """A declared timing CSV with no key column (or only a float one, not S/T/B): every row got the
    key () and only the last was kept, so a 10x read regression in row 1 was "no regression" (rc 0);
    `--save-baseline` wrote figures keyed {} that `--baseline` refused ("key {} matches 2 rows")."""
    out = tmp_path / "o"
    a = _oneshot(ab, out, R10B_A_PY=WRITE_T, R10B_A_FILES="t.csv", R10B_T=before)
    b = _oneshot(ab, out, R10B_A_PY=WRITE_T, R10B_A_FILES="t.csv", R10B_T=after).with_name("testrun.2")
    assert (b / "t.csv").read_text() == after
    r = _main(ab, "compare", a, b, "--json")
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    rows = [x for x in json.loads(r.stdout)["rows"] if x["source"] == "t.csv"]
    assert [(x["key"], x["a"], x["b"], x["mark"]) for x in rows] == [("row 1", 10, 99, "+"), ("row 2", 10, 10, "")]
    assert all("position" in x["note"] for x in rows)
    # a baseline cannot name such rows: the table is left out with a note, never written as key {}
    bl = tmp_path / "bl.json"
    r = _main(ab, "compare", b, "--save-baseline", bl)
    line = _one_error_line(r, "t.csv", "no key column")
    assert "no timing figures" in line and not bl.exists()


# ---- B4 -------------------------------------------------------------------------------------------


def _recorded_run(tmp_path):
    from nsa_runner.manifest import RunManifest

    m = RunManifest.new(tmp_path / "out", "r", ["nsa-run"])
    for rel, text in (("a.txt", "A1"), ("c.txt", "C1"), ("logs/a.log", "LOG1")):
        (m.dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (m.dir / rel).write_text(text)
    m.record({"name": "a", "status": "PASS", "reason": "ok", "files": ["a.txt", "c.txt"], "log": "logs/a.log"})
    return m


def _unchanged(m, manifest_before: str) -> None:
    assert [(m.dir / r).read_text() for r in ("a.txt", "c.txt", "logs/a.log")] == ["A1", "C1", "LOG1"]
    assert (m.dir / "manifest.json").read_text() == manifest_before
    history = m.dir / "history"
    assert not history.exists() or not [p for p in history.rglob("*") if not p.is_dir()]


@pytest.mark.parametrize("fails", ["second move", "manifest write"])
def test_a_set_aside_that_fails_midway_puts_back_what_it_moved(tmp_path, monkeypatch, fails):
    """set_aside moved the files one at a time: when a later move (or the history sub-folder, or the
    manifest's write) failed on a full disk, the files moved before stayed in history/ with nothing
    recording it, while the CLI said "earlier runs are untouched". Covered here on every machine by
    an injected ENOSPC; the CLI test below does it on a real tmpfs out of inodes."""
    import errno

    from nsa_runner import manifest as mf

    m = _recorded_run(tmp_path)
    before = (m.dir / "manifest.json").read_text()
    if fails == "second move":
        calls = []
        real_move = mf._move_entry  # (one entry's move: a rename since round 49, shutil.move before)

        def move(src, dst):
            calls.append(src)
            if len(calls) == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_move(src, dst)

        monkeypatch.setattr(mf, "_move_entry", move)
    else:
        def write_json(path, obj):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(mf, "write_json", write_json)
    with pytest.raises(OSError) as e:
        mf.RunManifest.open(m.dir, ["nsa-run", "stage", "a"]).set_aside("a") if fails == "second move" \
            else m.set_aside("a")
    assert not isinstance(e.value, getattr(mf, "SetAsideIncomplete", ()))  # everything went back
    monkeypatch.undo()
    if fails == "second move":  # open() added its `updates` entry before set_aside failed
        assert json.loads((m.dir / "manifest.json").read_text())["stages"] == json.loads(before)["stages"]
        before = (m.dir / "manifest.json").read_text()
    _unchanged(m, before)
    assert not json.loads(before).get("pending")
    # and the next rerun sets it aside as usual
    dest = mf.RunManifest.open(m.dir, ["nsa-run"]).set_aside("a")
    assert (dest / "a.txt").read_text() == "A1" and (dest / "logs" / "a.log").read_text() == "LOG1"


@pytest.fixture
def tmpfs(tmp_path):
    """A small tmpfs (80 MiB: --out's free-space check wants 64; 400 inodes), or a skip naming why."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=80m,nr_inodes=400", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"needs `mount -t tmpfs` (root with CAP_SYS_ADMIN) for a disk out of inodes: "
                    f"{(r.stderr or r.stdout).strip()[:200]}; the injected-ENOSPC test above covers set_aside")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_rerun_on_a_disk_out_of_inodes_leaves_the_earlier_result_in_place(ab, tmpfs):
    """On a tmpfs with 1, 2, 3 ... free inodes, `stage a` reruns: it exited 2 saying "earlier runs are
    untouched" while a.txt sat in history/a-…/ and the manifest still listed it (set_aside moved
    a.txt, then failed making history/a-…/logs, and never put a.txt back)."""
    out = tmpfs / "o"
    folder = _oneshot(ab, out, R10B_TEXT="v1 result")
    fill = tmpfs / "fill"
    fill.mkdir()
    n = 0
    while True:
        try:
            (fill / f"f{n}").touch()
        except OSError:
            break
        n += 1
    refused = 0
    for k in range(1, 8):
        (fill / f"f{n - k}").unlink()  # one more free inode each time
        r = _main(env_with(ab, R10B_TEXT="v2"), "stage", "a", "--out", out, "--device", "cpu")
        m = json.loads((folder / "manifest.json").read_text())
        if r.returncode == 0:
            break
        refused += 1
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert [s["files"] for s in m["stages"]] == [["a.txt"]], m["stages"]
        if m.get("pending"):
            # set aside and recorded, the stage then stopped by the full disk and the put-back could not
            # finish: the error says where the earlier result is and that the next run puts it back
            assert "could not be put back yet" in r.stderr and m["pending"][0]["moved_to"] in r.stderr, r.stderr
            break
        # nothing recorded: the earlier result is where it was (nothing half set aside)
        assert (folder / "a.txt").is_file() and (folder / "a.txt").read_text() == "v1 result", (k, r.stderr[-1500:])
        assert (folder / "logs" / "a.log").is_file(), (k, r.stderr[-1500:])
        assert not (folder / "history").exists() or not list((folder / "history").rglob("a.txt"))
    assert refused >= 2, "the disk was never full enough to refuse a rerun: the probe tested nothing"
    # with space again, the next rerun keeps v1 in history (recorded) and records v2: nothing lost
    shutil.rmtree(fill)
    r = _main(env_with(ab, R10B_TEXT="v2"), "stage", "a", "--out", out, "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    m = json.loads((folder / "manifest.json").read_text())
    assert (folder / "a.txt").read_text() == "v2" and not m.get("pending")
    kept = [folder / h["moved_to"] / "a.txt" for h in m["history"] if h["name"] == "a"]
    assert [p.read_text() for p in kept if p.is_file()] == ["v1 result"], (m["history"], kept)
