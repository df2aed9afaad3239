"""Round 14 A BR-1 (for artifacts.declared_file_problem): a declared name written as a folder
(``a.csv/``, ``a.csv/.``, ``a.csv//``, ``./a.csv/./``) for the regular file ``a.csv`` PASSed (``Path``
drops the trailing ``/``, so the file was found) and was recorded as written; every reader then
skipped it without a word (compare hid a regression, junit dropped a FAIL case, the report showed
no table, the links were broken). Now such a name is the stage's ERROR, named; a folder declared
with a trailing ``/`` is still a folder. Through the CLI (run id pinned)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

try:
    from _bad_days import PINNED, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import PINNED, env_with

RT = """
import os
from nsa_runner import Stage, StageResult, Status

class A(Stage):
    name, order, timeout_s = "a", 10, 120.0
    def run(self, ctx):
        (ctx.dir / "a.csv").write_text("case,status,ms\\nc1,FAIL,1.0\\n")
        (ctx.dir / "d").mkdir(exist_ok=True)
        (ctx.dir / "d" / "x.txt").write_text("x")
        return StageResult(Status.PASS, "a", files=os.environ["RT14A_FILES"].split(","))
"""


@pytest.fixture
def rt(plugins):
    plugins.make("rt14a-decl-plugin", "rt14a_decl_mod", RT, {"a": "rt14a_decl_mod:A"})
    env = plugins.env()
    env["NSA_RUN_SPARE_WORKER"] = "0"
    return env


def _oneshot(env, out, files: str):
    return subprocess.run([sys.executable, "-c", PINNED, "oneshot", "--only", "a", "--out", str(out),
                           "--device", "cpu"], env=env_with(env, RT14A_FILES=files), text=True,
                          capture_output=True, timeout=300)


def _stage_a(out) -> dict:
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    return next(s for s in m["stages"] if s["name"] == "a")


BAD = ["a.csv/", "a.csv/.", "a.csv//", "./a.csv/./"]


def test_br1_a_file_declared_with_a_trailing_slash_is_the_stages_error_naming_it(rt, tmp_path):
    out = tmp_path / "out"
    r = _oneshot(rt, out, ",".join([*BAD, "d/"]))
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    a = _stage_a(out)
    assert a["status"] == "ERROR", a
    assert "written as a folder" in a["reason"], a["reason"]
    for name in BAD:
        assert name in a["reason"], (name, a["reason"])
    assert a["files"] == ["d/"], a["files"]  # a folder written as one is still declared
    junit = (out / "testrun" / "junit.xml").read_text()
    assert "<failure" in junit or "<error" in junit, junit


def test_br1_the_same_file_declared_plainly_is_accepted(rt, tmp_path):
    out = tmp_path / "out"
    r = _oneshot(rt, out, "a.csv,d/")
    a = _stage_a(out)
    assert a["files"] == ["a.csv", "d/"] and "written as a folder" not in a["reason"], a
    # the stage's PASS with a FAIL row in its own case table is its FAIL since round 17 U-1 (8a77d24)
    assert r.returncode == 1 and a["status"] == "FAIL", (r.returncode, a)
    assert "1 row(s) of its declared case table(s) did not pass (c1 FAIL)" in a["reason"], a["reason"]
