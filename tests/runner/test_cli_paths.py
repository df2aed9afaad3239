"""Run folders from every way people call the CLI: relative and absolute ``--out``, another cwd,
``oneshot`` then ``stage X`` into the same run (issue 12: paths are resolved once, where the
run folder is made; stages always get an absolute ``ctx.dir``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from nsa_runner.artifacts import load_manifest

STAGES = """
import json
from nsa_runner import Stage, StageResult, Status

class Where(Stage):
    name, order = "where", 1
    def run(self, ctx):
        (ctx.dir / "where.json").write_text(json.dumps({"dir": str(ctx.dir), "absolute": ctx.dir.is_absolute()}))
        return StageResult(Status.PASS, "wrote where.json", files=["where.json"])
"""


@pytest.fixture
def where(plugins):
    plugins.make("where-stages", "where_stages_mod", STAGES, {"where": "where_stages_mod:Where"})
    return plugins


def _check_run(folder):
    m = load_manifest(folder)
    st = {s["name"]: s for s in m["stages"]}
    assert st["where"]["status"] == "PASS", st["where"]["reason"]
    info = json.loads((folder / "where.json").read_text())
    assert info["absolute"] and info["dir"] == str(folder.resolve())
    assert not (folder / "artifacts").exists()  # nothing nested under the run folder


@pytest.mark.parametrize("form", ["default", "relative", "dot-relative", "absolute"])
def test_oneshot_out_forms(where, cli, tmp_path, monkeypatch, form):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    args = {"default": [], "relative": ["--out", "res/x"], "dot-relative": ["--out", "./res/../res/x"],
            "absolute": ["--out", str(tmp_path / "abs")]}[form]
    r = cli("oneshot", "--only", "where", "--device", "cpu", *args)
    assert r.exit_code == 0, r.stdout + r.stderr
    root = {"default": cwd / "artifacts" / "runner", "relative": cwd / "res" / "x",
            "dot-relative": cwd / "res" / "x", "absolute": tmp_path / "abs"}[form]
    _check_run(root / "testrun")
    assert r.stdout.strip().splitlines()[-1] == "1 passed, 0 failed, 0 skipped"


def test_oneshot_then_stage_into_the_same_run_with_relative_out(where, cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli("oneshot", "--only", "where", "--device", "cpu", "--out", "out").exit_code == 0
    r = cli("stage", "where", "--device", "cpu", "--out", "out")
    assert r.exit_code == 0, r.stdout + r.stderr
    folder = tmp_path / "out" / "testrun"
    _check_run(folder)
    m = load_manifest(folder)
    assert [h["status"] for h in m["history"]] == ["PASS"]  # the earlier good result was set aside, kept
    moved = folder / m["history"][0]["moved_to"] / "where.json"
    assert moved.is_file()


def test_subprocess_from_another_cwd_relative_out(where, tmp_path):
    """The real console entry (a child process), started from an unrelated folder."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    r = subprocess.run([sys.executable, "-m", "nsa_runner.cli", "oneshot", "--only", "where", "--device", "cpu",
                        "--out", "rel"], cwd=cwd, env=where.env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = [p for p in (cwd / "rel").iterdir() if p.is_dir()]
    assert len(runs) == 1
    _check_run(runs[0])
    assert r.stdout.strip().splitlines()[-1] == "1 passed, 0 failed, 0 skipped"
