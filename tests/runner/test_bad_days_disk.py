"""Bad days, disk and special files (issue 16): ``--out`` is checked for room up front (exit 2, one
line); a run the disk fills up under is marked incomplete, exits 2 without a traceback and blocks
no later run; a FIFO, a symlink to /dev/zero or an oversized file where a manifest or a CSV should
be is refused by type and size before anything reads it (no hang, no memory blow-up)."""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections import namedtuple

import pytest
from _bad_days import make
from _runfolders import make_run


def test_an_out_folder_without_room_is_refused_up_front(plugins, cli, tmp_path, monkeypatch):
    make(plugins)
    from nsa_runner.commands import _common

    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(_common.shutil, "disk_usage", lambda p: Usage(10 << 30, 10 << 30, 5 << 20))
    (tmp_path / "out").mkdir()
    r = cli("oneshot", "--out", tmp_path / "out", "--only", "x", "--device", "cpu")
    assert r.exit_code == 2
    assert "only 5.0 MiB free" in r.stderr and "Traceback" not in r.stderr
    assert not any((tmp_path / "out").iterdir())  # an existing --out: kept, nothing created in it
    # round 37 U37-3: a new --out (and its new parents) made for the check is not left behind
    r = cli("oneshot", "--out", tmp_path / "new" / "out", "--only", "x", "--device", "cpu")
    assert r.exit_code == 2 and "only 5.0 MiB free" in r.stderr
    assert not (tmp_path / "new").exists()


def test_a_disk_that_fills_up_mid_run_leaves_an_incomplete_run_that_blocks_nothing(plugins, cli, tmp_path,
                                                                                 monkeypatch):
    make(plugins)
    from nsa_runner import manifest as manifest_mod

    real, calls = manifest_mod.write_json, {"n": 0}

    def full_once(path, obj):  # the manifest write of stage y's record finds the disk full
        if not calls["n"] and any(s.get("name") == "y" for s in obj.get("stages", [])):
            calls["n"] += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, obj)

    monkeypatch.setattr(manifest_mod, "write_json", full_once)
    out = tmp_path / "out"
    r = cli("oneshot", "--out", out, "--only", "x,y", "--device", "cpu")
    assert r.exit_code == 2, r.stdout + r.stderr
    assert "incomplete: No space left on device" in r.stderr and "disk is full" in r.stderr
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    assert m["incomplete"].startswith("the runner stopped") and m["finished"] is None
    assert [(s["name"], s["status"]) for s in m["stages"]] == [("x", "PASS")]
    monkeypatch.setattr(manifest_mod, "write_json", real)
    r = cli("oneshot", "--out", out, "--only", "x", "--device", "cpu")  # later runs are not blocked
    assert r.exit_code == 0, r.stderr
    r = cli("stage", "y", "--out", out, "--device", "cpu")
    assert r.exit_code == 0, r.stderr
    r = cli("report", "testrun", "--out", out)
    assert r.exit_code == 0, r.stderr


@pytest.fixture
def two_runs(tmp_path):
    out = tmp_path / "runs"
    make_run(out, "aaaaaaa", device="cpu")
    make_run(out, "bbbbbbb", device="cpu")
    return out


def _special(path, kind):
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "devzero":
        os.symlink("/dev/zero", path)
    elif kind == "folder":
        path.mkdir()
    else:  # a file past the reader's size limit (sparse: costs no disk)
        with open(path, "wb") as f:
            f.truncate(300 << 20)


@pytest.mark.parametrize("kind", ["fifo", "devzero", "folder", "huge"])
@pytest.mark.parametrize("name", ["manifest.json", "decode.csv", "env.json"])
def test_a_special_file_in_a_run_is_refused_before_reading(cli, two_runs, name, kind):
    _special(two_runs / "bbbbbbb" / name, kind)
    for cmd in (("compare", "aaaaaaa", "bbbbbbb"), ("report", "bbbbbbb")):
        r = cli(*cmd, "--out", two_runs)
        assert r.exit_code == 2, (cmd, r.stdout, r.stderr)
        err = r.stderr.replace("\n", " ")
        assert name in err and ("refused" in err or "not a run folder" in err or "expected a file" in err), err
        assert "Traceback" not in err


def test_a_fifo_manifest_in_the_latest_run_stops_stage_without_hanging(plugins, cli, tmp_path):
    make(plugins)
    out = tmp_path / "out"
    assert cli("stage", "x", "--out", out, "--device", "cpu").exit_code == 0
    shutil.move(out / "testrun" / "manifest.json", tmp_path / "saved.json")
    os.mkfifo(out / "testrun" / "manifest.json")
    r = cli("stage", "y", "--out", out, "--device", "cpu")
    assert r.exit_code == 2 and "is a FIFO, not a regular file; refused" in r.stderr.replace("\n", " ")
