"""Bad days, red-team round 50 (stop 42), through the CLI.

B50b-1: after a PASS that recorded ``a.txt`` and ``d/``, the user swapped them for links to a shared file and folder
outside the run folder (``ln -s``, to share a dataset). The rerun's set-aside left both links in place
(``stage_owns`` refuses a name that resolves outside) while the history record listed them as moved, and the attempt
wrote through them: the shared file was overwritten, a file appeared in the shared folder. A link at a recorded name
is now set aside as the link itself, never followed; the attempt writes fresh entries in the run folder.
"""

from __future__ import annotations

import json
import os
import subprocess

try:
    from _bad_days import cli_cmd, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, manifest

STAGE = """
import os
from nsa_runner import Stage, StageResult, Status


class L(Stage):
    name, order, timeout_s = "rtl", 10, 120.0

    def run(self, ctx):
        said = os.environ.get("R50_SAY", "first")
        (ctx.dir / "a.txt").write_text(said)
        (ctx.dir / "d").mkdir(exist_ok=True)
        (ctx.dir / "d" / "x.txt").write_text(said)
        return StageResult(Status.PASS, said, files=["a.txt", "d"])
"""


def test_a_rerun_sets_aside_recorded_names_swapped_for_links_out_never_writing_through_them(plugins, tmp_path):
    plugins.make("r50-links", "r50_links", STAGE, {"rtl": "r50_links:L"})
    out, shared, shared_dir = tmp_path / "o", tmp_path / "shared.txt", tmp_path / "shared_d"
    shared.write_text("shared data")
    shared_dir.mkdir()
    env = plugins.env()
    first = subprocess.run(cli_cmd("stage", "rtl", "--device", "cpu", "--out", out), env=env, capture_output=True,
                           text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    run = out / "testrun"
    os.unlink(run / "a.txt")
    (run / "d" / "x.txt").unlink()
    (run / "d").rmdir()
    os.symlink(shared, run / "a.txt")
    os.symlink(shared_dir, run / "d")
    r = subprocess.run(cli_cmd("stage", "rtl", "--device", "cpu", "--out", out), env={**env, "R50_SAY": "second"},
                       capture_output=True, text=True, timeout=300)
    # before: the shared file read "second", shared_d/x.txt appeared, the rerun ERROR "a.txt resolves outside"
    assert shared.read_text() == "shared data"
    assert list(shared_dir.iterdir()) == []
    assert r.returncode == 0, r.stderr[-2000:]
    (rec,) = manifest(out)["stages"]
    assert rec["status"] == "PASS" and rec["reason"] == "second", rec
    assert not (run / "a.txt").is_symlink() and (run / "a.txt").read_text() == "second"
    assert not (run / "d").is_symlink() and (run / "d" / "x.txt").read_text() == "second"
    (old,) = json.loads((run / "manifest.json").read_text())["history"]
    aside = run / old["moved_to"]
    assert os.readlink(aside / "a.txt") == str(shared) and os.readlink(aside / "d") == str(shared_dir)


def test_a_pending_note_whose_owner_names_no_process_is_said_as_such(plugins, tmp_path):
    """Round 50 U50b-1: a hand-edited pending note with no owner made ``stage`` refuse with "already running
    (nsa-run pid None)", naming a run that does not exist. It still counts as running (its owner cannot be
    checked), and is now said as a note that names no process, with what to do."""
    plugins.make("r50-links", "r50_links", STAGE, {"rtl": "r50_links:L"})
    out = tmp_path / "o"
    env = plugins.env()
    first = subprocess.run(cli_cmd("stage", "rtl", "--device", "cpu", "--out", out), env=env, capture_output=True,
                           text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    path = out / "testrun" / "manifest.json"
    data = json.loads(path.read_text())
    data["pending"] = [{"stage": "rtl", "token": "handmade"}]
    path.write_text(json.dumps(data))
    r = subprocess.run(cli_cmd("stage", "rtl", "--device", "cpu", "--out", out), env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "pid None" not in r.stderr and "names no process" in r.stderr, r.stderr[-2000:]
    assert "remove that note" in r.stderr and "Traceback" not in r.stderr
