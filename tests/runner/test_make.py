"""``make oneshot`` as the README gives it (issue 12): from the Makefile, with the default relative
``--out``; the CLI's own exit code is named on make's last line and kept in manifest.json (GNU
make itself turns every failing recipe into 2, which no recipe can change)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent  # the venv running the tests, as the Makefile's VENV
STAGES = """
from nsa_runner import Stage, StageResult, Status

class Ok(Stage):
    name, order = "ok", 1
    def run(self, ctx):
        return StageResult(Status.PASS, "fine")

class Bad(Stage):
    name, order = "bad", 2
    def run(self, ctx):
        return StageResult(Status.FAIL, "a check did not hold")
"""

pytestmark = pytest.mark.skipif(shutil.which("make") is None or not (VENV / "bin" / "nsa-run").exists(),
                                reason="needs GNU make and the nsa-run script in the venv running the tests")


@pytest.fixture
def make(plugins, tmp_path):
    plugins.make("make-stages", "make_stages_mod", STAGES, {"ok": "make_stages_mod:Ok", "bad": "make_stages_mod:Bad"})
    cwd = tmp_path / "clone"
    cwd.mkdir()

    def run(args: str) -> subprocess.CompletedProcess:
        # -o STAMP: never (re)install from a test; -f: the repo's Makefile, run from another folder
        return subprocess.run(["make", "-s", "-f", str(REPO / "Makefile"), "-o", str(VENV / ".nsa-run-installed"),
                               "oneshot", f"VENV={VENV}", f"ARGS={args}"], cwd=cwd, env=plugins.env(),
                              capture_output=True, text=True, timeout=600)

    return run, cwd


def _manifest(cwd: Path) -> dict:
    (folder,) = [p for p in (cwd / "artifacts" / "runner").iterdir() if p.is_dir()]
    return json.loads((folder / "manifest.json").read_text())


def test_make_oneshot_passes_with_the_default_relative_out(make):
    run, cwd = make
    r = run("--only ok --device cpu")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == "1 passed, 0 failed, 0 skipped"
    m = _manifest(cwd)
    assert m["exit_code"] == 0 and [s["status"] for s in m["stages"]] == ["PASS"]


def test_make_oneshot_names_the_clis_exit_code_1_on_a_failed_check(make):
    run, cwd = make
    r = run("--only ok,bad --device cpu")
    assert r.returncode == 2  # GNU make's own code for any failing recipe
    assert "make oneshot: nsa-run exited 1 (1 = a check failed" in r.stderr
    assert _manifest(cwd)["exit_code"] == 1


def test_make_oneshot_names_the_clis_exit_code_2_on_bad_usage(make):
    run, cwd = make
    r = run("--only no-such-stage --device cpu")
    assert r.returncode == 2
    assert "unknown stage 'no-such-stage'" in r.stderr and "nsa-run exited 2" in r.stderr
    assert not (cwd / "artifacts").exists() or not any((cwd / "artifacts" / "runner").iterdir())
