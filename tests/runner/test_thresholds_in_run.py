"""Routing thresholds (issue 12): a per-user file (platformdirs), recorded in env.txt, copied into
the run folder, and shown with the measured ones in report.html's routing rows."""

from __future__ import annotations

import json
import shutil

from nsa_core import routing


def test_default_thresholds_file_is_per_user_not_in_the_package(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    p = routing.default_thresholds_path()
    assert p == tmp_path / "data" / "nsa-run" / "routing" / "thresholds.json"
    import nsa_core

    assert not str(routing.DEFAULT_THRESHOLDS).startswith(str(__import__("pathlib").Path(nsa_core.__file__).parent))


def test_run_records_copies_and_reports_the_thresholds(cli, tmp_path, monkeypatch):
    data = tmp_path / "data"
    user_file = data / "nsa-run" / "routing" / "thresholds.json"
    user_file.parent.mkdir(parents=True)
    shutil.copy(routing.SHIPPED_THRESHOLDS, user_file)
    monkeypatch.setenv("XDG_DATA_HOME", str(data))  # the stage processes resolve the per-user file here
    r = cli("oneshot", "--out", tmp_path / "out", "--only", "env-pairing,sanity,summary", "--device", "cpu")
    assert r.exit_code == 0, r.stdout + r.stderr
    folder = tmp_path / "out" / "testrun"
    env_txt = (folder / "env.txt").read_text()
    assert f"routing thresholds file  {user_file}  (copied into this run as routing_thresholds.json)" in env_txt
    assert (folder / "routing_thresholds.json").read_bytes() == user_file.read_bytes()
    m = json.loads((folder / "manifest.json").read_text())
    assert "routing_thresholds.json" in next(s for s in m["stages"] if s["name"] == "env-pairing")["files"]
    html = (folder / "report.html").read_text()
    assert "routing thresholds used" in html and "routing thresholds file" in html
    assert "routing thresholds measured" in html and "not measured in this run (fa2-probe did not run)" in html
    # a later change of the per-user file does not change what the run kept
    user_file.write_text("{}")
    assert (folder / "routing_thresholds.json").read_bytes() != user_file.read_bytes()


def test_absent_thresholds_file_is_said_in_env_txt(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "empty"))
    r = cli("oneshot", "--out", tmp_path / "out", "--only", "env-pairing", "--device", "cpu")
    assert r.exit_code == 0, r.stdout + r.stderr
    env_txt = (tmp_path / "out" / "testrun" / "env.txt").read_text()
    assert "routing thresholds file  " + str(tmp_path / "empty" / "nsa-run" / "routing" / "thresholds.json") in env_txt
    assert "absent" in env_txt and not (tmp_path / "out" / "testrun" / "routing_thresholds.json").exists()
