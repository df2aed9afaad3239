"""Bad days, red-team round 18 (part A) A-R6, through the CLI: a signal right after a stage's PASS (once the runner had
claimed the next stage in ``pending``, before that stage began) left the claim and its owner lock in the run folder:
``report`` said "runner died / unfinished: the nsa-run running stage y is gone" of a run that exited 130.

Expected: the run's finish drops this process's claims that moved nothing aside; the run reads "interrupted".
The SIGTERM is sent by the runner to itself right after claiming y (through the CLI's own handler).
"""

from __future__ import annotations

import subprocess
import sys

try:
    from _bad_days import MAIN, cli_cmd, env_with, make, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, cli_cmd, env_with, make, manifest

_AT_CLAIM = MAIN.replace("from nsa_runner.cli import main", (
    "import os, signal; from nsa_runner import manifest as mf; real = mf.RunManifest.mark_running\n"
    "def claim(self, name):\n"
    "    real(self, name)\n"
    "    if name == 'y':\n"
    "        os.kill(os.getpid(), signal.SIGTERM)\n"
    "mf.RunManifest.mark_running = claim\n"
    "from nsa_runner.cli import main"))
assert _AT_CLAIM != MAIN


def test_a_signal_after_the_next_stage_is_claimed_leaves_no_claim(plugins, tmp_path):
    out, env = tmp_path / "out", make(plugins)
    r = subprocess.run([sys.executable, "-c", _AT_CLAIM, "oneshot", "--only", "x,y,z", "--out", str(out),
                        "--device", "cpu"], env=env_with(env), capture_output=True, text=True, timeout=300)
    assert r.returncode == 130, r.stdout + r.stderr
    m = manifest(out)
    assert not m.get("pending"), m.get("pending")
    assert not list((out / "testrun").glob(".manifest.lock.*")), list((out / "testrun").iterdir())
    rep = subprocess.run(cli_cmd("report", "testrun", "--out", out), env=env, capture_output=True, text=True,
                         timeout=300)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    assert "runner died" not in rep.stdout and "INTERRUPTED" in rep.stdout, rep.stdout
