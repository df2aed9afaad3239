"""Bad days, containment (issue 16): a stage's declared files must stay inside the run folder.

A name that climbs out (``..``), an absolute path, a symlink pointing out, or a folder the runner
shares between stages (``logs``, ``history``, the manifest, the run folder itself) makes the stage
ERROR naming the file; a rerun (``nsa-run stage X``) never moves anything outside the run folder,
nor another stage's files, into ``history/``.
"""

from __future__ import annotations

import json
import os

import pytest

from nsa_runner.artifacts import load_manifest, write_json

ESCAPE = """
import os
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

class Esc(Stage):
    name = "esc"
    order = 50
    def run(self, ctx):
        spec = os.environ["ESC_FILES"]
        files = [f.replace("@RUN", str(ctx.dir)) for f in spec.split(";")]
        if "link" in files:
            os.symlink(os.environ["ESC_OUTSIDE"], ctx.dir / "link")
        (ctx.dir / "mine.txt").write_text("mine")
        return StageResult(Status.PASS, "ok", files=files)

class Other(Stage):
    name = "other"
    order = 40
    def run(self, ctx):
        (ctx.dir / "other.txt").write_text("other")
        print("other's log line")
        return StageResult(Status.PASS, "fine", files=["other.txt"])
"""


@pytest.fixture
def outside(tmp_path):
    p = tmp_path / "precious.txt"
    p.write_text("not the runner's")
    return p


def _setup(plugins, monkeypatch, files, outside):
    plugins.make("esc-plugin", "esc_plugin_mod", ESCAPE, {"esc": "esc_plugin_mod:Esc",
                                                           "other": "esc_plugin_mod:Other"})
    monkeypatch.setenv("ESC_FILES", files)
    monkeypatch.setenv("ESC_OUTSIDE", str(outside))


@pytest.mark.parametrize("declared, named", [
    ("mine.txt;../../precious.txt", "../../precious.txt"),
    ("mine.txt;@OUT", "precious.txt"),
    ("mine.txt;link", "link"),
    ("logs", "logs"),
    ("mine.txt;logs/other.log", "logs/other.log"),
    ("manifest.json", "manifest.json"),
    (".", "."),
])
def test_a_declared_file_outside_the_stage_own_is_an_error_naming_it(plugins, cli, tmp_path, monkeypatch,
                                                                    outside, declared, named):
    _setup(plugins, monkeypatch, declared.replace("@OUT", str(outside)), outside)
    out = tmp_path / "out"
    r = cli("oneshot", "--out", out, "--only", "other,esc", "--device", "cpu", "--json")
    assert r.exit_code == 1, r.stdout + r.stderr
    st = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    assert st["other"]["status"] == "PASS"
    assert st["esc"]["status"] == "ERROR", st["esc"]
    assert named in st["esc"]["reason"]
    assert all(f == "mine.txt" for f in st["esc"]["files"])
    # a rerun of the stage moves only what is its own into history, never the outside file
    r = cli("stage", "esc", "--out", out, "--device", "cpu")
    assert outside.read_text() == "not the runner's"
    run = out / "testrun"
    assert (run / "other.txt").read_text() == "other"
    assert "other's log line" in (run / "logs" / "other.log").read_text()
    assert load_manifest(run)["stages"][0]["name"] == "other"


@pytest.mark.parametrize("bad", ["../../precious.txt", "@OUT", "logs", "link", "history", "."])
def test_a_rerun_never_moves_anything_outside_the_run_folder(plugins, cli, tmp_path, monkeypatch, outside, bad):
    """Even a manifest that already lists such names (hand-edited, older nsa-run) is safe."""
    _setup(plugins, monkeypatch, "mine.txt", outside)
    out = tmp_path / "out"
    r = cli("oneshot", "--out", out, "--only", "other,esc", "--device", "cpu")
    assert r.exit_code == 0, r.stdout + r.stderr
    run = out / "testrun"
    if bad == "link":
        (run / "link").symlink_to(outside)
    m = load_manifest(run)
    esc = next(s for s in m["stages"] if s["name"] == "esc")
    esc["files"].append(bad.replace("@OUT", str(outside)))
    write_json(run / "manifest.json", m)
    r = cli("stage", "esc", "--out", out, "--device", "cpu")
    assert r.exit_code == 0, r.stdout + r.stderr
    assert outside.read_text() == "not the runner's"
    assert (run / "other.txt").read_text() == "other"
    assert "other's log line" in (run / "logs" / "other.log").read_text()
    moved = [p for p in (run / "history").rglob("*") if p.is_file() or p.is_symlink()]
    if bad == "link":  # the link itself, a name inside the run folder, is set aside as a link, never followed
        # (round 50 B50b-1: left in place, a rerun's attempt wrote through it into the file outside)
        (link,) = [p for p in moved if p.name == "link"]
        assert link.is_symlink() and os.readlink(link) == str(outside)
        moved.remove(link)
    assert sorted(p.name for p in moved) == ["esc.log", "mine.txt"], moved
    assert (run / "mine.txt").read_text() == "mine"  # the rerun's own result
