"""Bad days, red-team round 14 (part A) BR-5, through the CLI: the temp folder (TMPDIR) runs out of
inodes after the runner wrote a stage's job file and before the worker marks the stage's start
(``started``, beside the job). The worker ignored that OSError: the runner never saw the stage begin,
gave it its worker's start-up grace (``executor.PRELOAD_GRACE_S``, 120 s) on top of its 5 s timeout,
and recorded "TIMEOUT: the stage did not begin within 125s (its worker was still starting)" while the
stage had run at once.

Expected: the stage is an ERROR at once naming the full temp folder (never a 125 s wait called a slow
start), and the stage's work is not run unseen by the runner's clock.

The temp folder is filled from the worker's own interpreter start (a ``sitecustomize`` on the
plugin's path, acting only in a stage worker when the test asks): after the job file, before the
marker, with no race. A small tmpfs is mounted, so the test needs root (it skips otherwise).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

try:
    from _bad_days import MAIN, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with


STAGES = """
import os, time
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

class Q(Stage):
    name, order, timeout_s = "q", 10, 5.0
    def run(self, ctx):
        Path(os.environ["R14BS_RAN"]).write_text("ran")
        time.sleep(300)
        return StageResult(Status.PASS, "q")
"""

# another job filling the temp folder's inodes, at the moment a stage's worker starts
SITECUSTOMIZE = """
import os, sys
argv = getattr(sys, "orig_argv", [])
if os.environ.get("R14BS_FILL") and "nsa_runner._worker" in argv and "--watchdog" not in argv:
    where = os.path.join(os.environ["R14BS_FILL"], "fill-" + str(os.getpid()))
    try:
        os.mkdir(where)
        for i in range(1 << 20):
            open(os.path.join(where, str(i)), "wb").close()
    except OSError:
        pass
"""


@pytest.fixture
def small_tmp(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where = tmp_path / f"t-{uuid.uuid4().hex[:8]}"
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m,nr_inodes=400", "tmpfs", str(where)],
                       capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.decode(errors='replace').strip()}")
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_start_marker_that_cannot_be_written_is_the_stages_error_naming_the_temp_folder(plugins, tmp_path,
                                                                                            small_tmp):
    plugins.make("r14bs-plugin", "r14bs_mod", STAGES, {"q": "r14bs_mod:Q"})
    (plugins.site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    out, ran = tmp_path / "out", tmp_path / "ran"
    env = env_with(plugins.env(), TMPDIR=small_tmp, R14BS_FILL=small_tmp, R14BS_RAN=ran, NSA_RUN_SPARE_WORKER=0)
    r = subprocess.run([sys.executable, "-c", MAIN, "oneshot", "--only", "q", "--out", out, "--device", "cpu",
                        "--json"], env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 1, r.stderr[-3000:]
    (q,) = json.loads(r.stdout)["stages"]
    assert q["status"] == "ERROR", q
    assert "did not begin" not in q["reason"], q["reason"]
    assert f"the temp folder {small_tmp}" in q["reason"] and "is full" in q["reason"], q["reason"]
    assert not ran.exists(), "the stage ran while the runner could not see it begin"
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    assert [(s["name"], s["status"]) for s in m["stages"]] == [("q", "ERROR")]
    log = (out / "testrun" / m["stages"][0]["log"]).read_text()
    assert "its start could not be marked" in log, log[-2000:]
    # nothing of nsa-run's left in the temp folder (the filler's files are the other job's)
    assert not [p for p in small_tmp.iterdir() if p.name.startswith("nsa-run-")]
