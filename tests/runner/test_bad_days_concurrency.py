"""Bad days, concurrency (issue 16): two ``nsa-run stage`` into one run folder at once lose no
manifest record (updates under a file lock, on a fresh read); many ``oneshot`` into one ``--out``
at once all succeed in distinct folders (a folder appears with its manifest or not at all); an
empty run folder (what a run killed mid-creation left before this fix) blocks nothing."""

from __future__ import annotations

import json
import subprocess

from _bad_days import cli_cmd, env_with, make, manifest, wait_for


def test_two_stage_commands_at_once_into_one_run_lose_no_record(plugins, tmp_path, spawn):
    env = make(plugins)
    out = tmp_path / "out"
    first = subprocess.run(cli_cmd("stage", "z", "--out", out, "--device", "cpu"), env=env, capture_output=True,
                           text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    # x and y run at the same time into the same run folder; each reads the manifest before the
    # other writes its record (each stage sleeps), so a read-modify-write without a lock loses one
    procs = []
    for name in ("x", "y"):
        mark = tmp_path / f"{name}.started"
        procs.append((spawn(cli_cmd("stage", name, "--out", out, "--device", "cpu"),
                            env=env_with(env, BD_MARK=mark, BD_SLEEP=1.5), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True), mark))
    for proc, mark in procs:
        wait_for(mark, proc=proc)
    for proc, _ in procs:
        so, se = proc.communicate(timeout=120)
        assert proc.returncode == 0, se
    m = manifest(out)
    assert sorted((s["name"], s["status"]) for s in m["stages"]) == [("x", "PASS"), ("y", "PASS"), ("z", "PASS")]
    assert [p for p in out.iterdir() if p.is_dir()] == [out / "testrun"]  # one run folder, no leftovers
    assert not m.get("pending")


def test_many_oneshots_at_once_into_one_out_all_succeed_in_distinct_folders(plugins, tmp_path, spawn):
    env = make(plugins)
    out = tmp_path / "out"
    n = 4
    procs = [spawn(cli_cmd("oneshot", "--out", out, "--only", "x", "--device", "cpu"), env=env,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
    results = [(p.communicate(timeout=240), p.returncode) for p in procs]
    assert [rc for _, rc in results] == [0] * n, [se[-600:] for (_, se), rc in results if rc]
    folders = sorted(p.name for p in out.iterdir())
    assert folders == sorted(["testrun"] + [f"testrun.{i}" for i in range(2, n + 1)]), folders
    for f in folders:
        m = json.loads((out / f / "manifest.json").read_text())
        assert [(s["name"], s["status"]) for s in m["stages"]] == [("x", "PASS")], f


def test_an_empty_run_folder_blocks_no_later_run(plugins, cli, tmp_path):
    make(plugins)
    out = tmp_path / "out"
    (out / "testrun").mkdir(parents=True)  # another run mid-creation, or a full disk before this fix
    r = cli("oneshot", "--out", out, "--only", "x", "--device", "cpu")
    assert r.exit_code == 0, r.stdout + r.stderr
    assert (out / "testrun.2" / "manifest.json").is_file()
    r = cli("stage", "y", "--out", out, "--device", "cpu")
    assert r.exit_code == 0, r.stdout + r.stderr
    m = json.loads((out / "testrun.2" / "manifest.json").read_text())
    assert [s["name"] for s in m["stages"]] == ["x", "y"]  # stage y went to the latest real run


def test_a_stage_already_running_in_the_folder_is_refused_not_doubled(plugins, tmp_path, spawn):
    env = make(plugins)
    out = tmp_path / "out"
    mark = tmp_path / "x.started"
    proc = spawn(cli_cmd("stage", "x", "--out", out, "--device", "cpu"), env=env_with(env, BD_MARK=mark, BD_SLEEP=30),
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(mark, proc=proc)
    second = subprocess.run(cli_cmd("stage", "x", "--out", out, "--device", "cpu"), env=env, capture_output=True,
                            text=True, timeout=120)
    assert second.returncode == 2, second.stderr
    assert "already running" in second.stderr and "Traceback" not in second.stderr
    proc.kill()
