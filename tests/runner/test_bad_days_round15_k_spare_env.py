"""Bad days, red-team round 14 (part A) U4, through the CLI: ``NSA_RUN_SPARE_WORKER`` took only the
exact ``0`` as off; ``false`` / ``off`` / ``no`` silently left the spare on, and nonsense was on too.

Expected: 1/true/yes/on and 0/false/no/off (any case) are understood; anything else is refused in one
line naming the variable, exit 2, no traceback, nothing run (as NSA_RUN_LOCK_TIMEOUT). Whether the
second stage ran in a spare is read from its worker's own argv (``_worker --spare``), not from timing.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with

STAGES = """
import os
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

def _spared():
    pid = os.getpid()
    while pid > 1:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\\0")
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            return "unknown"
        if b"nsa_runner._worker" in argv:
            return "spare" if b"--spare" in argv else "fresh"
    return "unknown"

class A(Stage):
    name, order, timeout_s = "a", 10, 120.0
    def run(self, ctx):
        return StageResult(Status.PASS, "a")

class B(Stage):
    name, order, timeout_s = "b", 20, 120.0
    def run(self, ctx):
        (ctx.dir / "b.txt").write_text(_spared())
        return StageResult(Status.PASS, "b", files=["b.txt"])
"""


def _run(plugins, tmp_path, value, out_name):
    plugins.make("r15k-spare", "r15k_spare_mod", STAGES, {"a": "r15k_spare_mod:A", "b": "r15k_spare_mod:B"})
    out = tmp_path / out_name
    out.mkdir()
    env = env_with(plugins.env(), NSA_RUN_SPARE_WORKER=value)
    p = subprocess.run([sys.executable, "-c", MAIN, "oneshot", "--only", "a,b", "--out", str(out)],
                       env=env, capture_output=True, text=True, timeout=300)
    return p, out


@pytest.mark.parametrize("value", ["false", "OFF", "no", "0"])
def test_u4_off_words_turn_the_spare_off(plugins, tmp_path, value):
    p, out = _run(plugins, tmp_path, value, "o")
    assert p.returncode == 0, p.stdout + p.stderr
    assert (out / "testrun" / "b.txt").read_text() == "fresh"


@pytest.mark.parametrize("value", ["TRUE", "on"])
def test_u4_on_words_keep_the_spare(plugins, tmp_path, value):
    p, out = _run(plugins, tmp_path, value, "o")
    assert p.returncode == 0, p.stdout + p.stderr
    assert (out / "testrun" / "b.txt").read_text() == "spare"


@pytest.mark.parametrize("value", ["nope", "2", "of"])
def test_u4_nonsense_is_refused_in_one_line(plugins, tmp_path, value):
    p, out = _run(plugins, tmp_path, value, "o")
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    assert "NSA_RUN_SPARE_WORKER" in p.stderr and repr(value) in p.stderr
    assert not (out / "testrun").exists()  # nothing run
