"""Bad days, red-team round 9 (issue 16): new probes of the same families, each through the CLI.

Every test here reproduces an attack that worked on the code before round 9's fixes (see
docs/reliability.md, "Red-team round 9"): a JSON number beyond a float's range (``1e400``, read
as inf) in manifest.json ended the next ``stage`` with an anonymous "ValueError: Out of range
float values ... (unexpected)" and ``report`` accepted it (round 8 refused only the ``NaN`` /
``Infinity`` literals); a ``pending`` note whose ``moved_to`` is a link ``history/evil -> /elsewhere``
made the next ``stage`` "put back" the files of that outside folder into the run folder and remove
its empty sub-folders; an escape sequence in the run folder's path reached the terminal raw on
``report``'s ``report:`` / ``summary.md:`` lines; ``report`` of a run another nsa-run was still
running printed "0 passed, 0 failed, 0 skipped" without a word that it was still running.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN, cli_cmd, dead_pid, env_with, make, wait_for
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, cli_cmd, dead_pid, env_with, make, wait_for

# the nsa-run script itself (cli.main: what a terminal or CI job runs), run id pinned


def main_cmd(*args) -> list[str]:
    return [sys.executable, "-c", MAIN, *map(str, args)]


@pytest.fixture
def bd(plugins):
    return make(plugins)


def _main(env, *args, timeout=90, **kw):
    return subprocess.run(main_cmd(*args), env=env, text=True, timeout=timeout, capture_output=True, **kw)


def _one_error_line(r, *names):
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and "unexpected" not in r.stderr, r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and all(n in err[0] for n in names), r.stderr
    return err[0]


def _oneshot_x(env, out):
    r = subprocess.run(cli_cmd("oneshot", "--out", out, "--only", "x", "--device", "cpu"), env=env, text=True,
                       timeout=90, capture_output=True)
    assert r.returncode == 0, r.stderr
    return out / "testrun"


def test_a_float_beyond_range_in_manifest_json_is_named_and_nothing_changes(bd, tmp_path):
    """json reads 1e400 as inf: `stage` failed writing it back ("Out of range float values are not
    JSON compliant: inf (unexpected)") and `report` showed it as a duration."""
    folder = _oneshot_x(bd, tmp_path / "o")
    path = folder / "manifest.json"
    path.write_text(path.read_text().replace('"duration_s": ', '"duration_s": 1e400, "was": ', 1))
    before = path.read_text()
    line = _one_error_line(_main(bd, "stage", "y", "--out", tmp_path / "o", "--device", "cpu"), "manifest.json")
    assert "1e400" in line and "range" in line
    _one_error_line(_main(bd, "report", folder), "manifest.json", "1e400")
    assert path.read_text() == before and not (folder / "y.txt").exists()


def test_a_pending_note_naming_a_linked_history_folder_touches_nothing_outside(bd, tmp_path):
    """A rerun "whose runner died" with moved_to = history/evil, a link to an outside folder: the
    next `stage` moved that folder's x.txt and logs/x.log into the run folder and removed its empty
    sub-folders."""
    folder = _oneshot_x(bd, tmp_path / "o")
    victim = tmp_path / "victim"
    (victim / "logs").mkdir(parents=True)
    (victim / "e1" / "e2").mkdir(parents=True)
    (victim / "x.txt").write_text("VICTIM")
    (victim / "logs" / "x.log").write_text("VLOG")
    (folder / "history").mkdir()
    (folder / "history" / "evil").symlink_to(victim)
    path = folder / "manifest.json"
    m = json.loads(path.read_text())
    m["pending"] = [{"stage": "x", "token": "gone", "since": "2026-01-01T00:00:00+00:00", "moved_to": "history/evil",
                     "owner": {"pid": dead_pid(), "pid_started": 0.0, "hostname": socket.gethostname()}}]
    path.write_text(json.dumps(m))
    tree = sorted(str(p.relative_to(victim)) for p in victim.rglob("*"))
    r = _main(bd, "stage", "y", "--out", tmp_path / "o", "--device", "cpu")
    # round 13 A-B2: a set-aside folder that is a link is refused, named, its note kept (exit 2): a
    # rerun's attempt can make that link itself, and dropping the note silently left the attempt's
    # files under the earlier record (was: rc 0, the note dropped)
    assert r.returncode == 2, r.stderr
    assert "history/evil is a symlink" in r.stderr and "Traceback" not in r.stderr
    assert sorted(str(p.relative_to(victim)) for p in victim.rglob("*")) == tree
    assert (victim / "x.txt").read_text() == "VICTIM" and (victim / "logs" / "x.log").read_text() == "VLOG"
    assert (folder / "x.txt").read_text() == "v1"  # the recorded result stays
    assert [p["moved_to"] for p in json.loads(path.read_text()).get("pending")] == ["history/evil"]


def test_an_escape_in_the_run_folder_path_never_reaches_the_terminal(bd, tmp_path):
    """`report`'s "report: PATH" and "summary.md: PATH" lines printed the path's ESC as is (the
    progress and artifacts lines already stripped it)."""
    folder = _oneshot_x(bd, tmp_path / "\x1b[31mred\x1b]8;;http://x\x1b\\")
    r = _main(bd, "report", folder)
    assert r.returncode == 0, r.stderr
    assert "report:" in r.stdout and "summary.md:" in r.stdout
    assert "\x1b" not in r.stdout + r.stderr


def test_report_of_a_run_still_running_says_so_before_its_counts(bd, tmp_path):
    """Mid-stage, `report` printed "0 passed, 0 failed, 0 skipped" (rc 0) like a verdict."""
    out = tmp_path / "o"
    folder = out / "testrun"
    mark = tmp_path / "mark"
    proc = subprocess.Popen(main_cmd("stage", "x", "--out", out, "--device", "cpu"),
                            env=env_with(bd, BD_MARK=mark, BD_SLEEP=60), text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(mark, proc=proc)
        r = _main(bd, "report", folder)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        running = [i for i, ln in enumerate(lines) if ln.startswith("RUNNING:")]
        counts = [i for i, ln in enumerate(lines) if "passed," in ln]
        assert running and counts and running[0] < counts[0], r.stdout
        assert f"pid {proc.pid}" in lines[running[0]] and "stage x" in lines[running[0]], r.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    r = _main(bd, "report", folder)  # nothing runs any more: no such line
    assert r.returncode == 0 and "RUNNING" not in r.stdout and "INTERRUPTED" in r.stdout, r.stdout
