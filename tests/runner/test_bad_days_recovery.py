"""Bad days, red-team round 2 (issue 16): recovering a rerun is idempotent. A put-back whose manifest
write failed (a full disk during ``stage x``'s rerun) leaves ``pending`` behind with the earlier files
already back in place; the next ``stage y`` must clear it and move nothing the recorded entry owns."""

from __future__ import annotations

import json
import socket

from _bad_days import dead_pid, make, manifest


def test_a_pending_rerun_already_put_back_is_cleared_without_moving_the_recorded_files(plugins, cli, tmp_path):
    make(plugins)
    out = tmp_path / "out"
    assert cli("stage", "x", "--out", out, "--device", "cpu").exit_code == 0
    run = out / "testrun"
    # what a rerun on a full disk leaves: earlier files already moved back, the empty set-aside folder,
    # but the manifest write that would have cleared `pending` failed (ENOSPC)
    (run / "history" / "x-then").mkdir(parents=True)
    m = manifest(out)
    m["pending"] = [{"stage": "x", "token": "gone", "since": "2026-01-01T00:00:00+00:00",
                     "moved_to": "history/x-then",
                     "owner": {"pid": dead_pid(), "pid_started": 0.0, "hostname": socket.gethostname()}}]
    (run / "manifest.json").write_text(json.dumps(m))

    r = cli("stage", "y", "--out", out, "--device", "cpu")
    assert r.exit_code == 0, r.stderr
    m = manifest(out)
    assert not m.get("pending")
    (x,) = [s for s in m["stages"] if s["name"] == "x"]
    assert x["status"] == "PASS" and (run / "x.txt").read_text() == "v1"  # still where the entry says
    assert "x wrote v1" in (run / "logs" / "x.log").read_text()
    assert not [p for p in (run / "history").rglob("*") if p.is_file()]  # nothing of x moved to history
