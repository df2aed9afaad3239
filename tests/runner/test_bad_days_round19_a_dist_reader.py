"""Bad days, red-team round 19 (part B) B19-2, through the CLI: a stale ``nsa-run`` distribution on sys.path
whose RECORD names a ``.pth`` that is a FIFO hung EVERY command (``registry._lists_running_package`` opened
each listed ``.pth`` with a blocking ``open()``), ``list`` and even ``stage env-pairing --help``.

Expected: the ``.pth`` is read through the one safe reader of installed distributions' files
(``nsa_core/_distfiles.py``: non-blocking, regular files only, bounded), which nsa-run's discovery, its own
metadata check and the flash facts (``detect.safe_distribution``) share; a FIFO there is simply not ours."""

from __future__ import annotations

import json
import os
import subprocess
import sys

try:
    from _bad_days import MAIN, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with

GOOD = """
from nsa_runner import Stage, StageResult, Status
class Ok(Stage):
    name, order, timeout_s = "ok19a", 80, 30.0
    def run(self, ctx): return StageResult(Status.PASS, "ok")
"""


def _run(plugins, *args):
    env = env_with(plugins.env(), NSA_RUN_SPARE_WORKER="0")
    return subprocess.run([sys.executable, "-c", MAIN, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=60)  # (a guard: before the fix it never ended)


def _stale_nsa_run_with_fifo_pth(site):
    info = site / "nsa_run-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nsa-run\nVersion: 0.0.1\n")
    (info / "RECORD").write_text("nsa_run.pth,,\n")
    os.mkfifo(site / "nsa_run.pth")  # nobody ever writes it: a blocking open waits forever


def test_b19_2_a_stale_nsa_run_whose_pth_is_a_fifo_never_hangs_a_command(plugins):
    plugins.make("r19a-ok", "r19a_ok_mod", GOOD, {"ok19a": "r19a_ok_mod:Ok"})
    _stale_nsa_run_with_fifo_pth(plugins.site)
    r = _run(plugins, "list", "--json")
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    stages = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    assert stages["ok19a"]["runs_here"] and stages["sanity"]["runs_here"], stages
    assert stages["sanity"]["source"] == "built-in", stages["sanity"]  # the running nsa-run is still ours
    r = _run(plugins, "stage", "env-pairing", "--help")
    assert r.returncode == 0 and "Usage" in r.stdout, (r.returncode, r.stderr[-3000:])


def test_one_reader_shared_and_loaded_without_importing_torch(plugins):
    """The reader lives in nsa_core (which nsa_runner may use, never the other way) and is loaded by its file:
    the CLI's check of the installed metadata runs before anything imports torch (whose import reads every
    distribution's entry_points.txt). Discovery, the registry and detect.safe_distribution use that one."""
    code = ("import sys, nsa_runner.registry as r, nsa_runner._discover as d; "
            "f = sys.modules['nsa_core._distfiles']; print('torch' in sys.modules, 'nsa_core' in sys.modules); "
            "print(d.read_dist_file is f.read_dist_file, r.SafeDistribution is f.SafeDistribution); "
            "import nsa_core.flash.detect as det; print(det._distfiles() is f)")
    r = subprocess.run([sys.executable, "-c", code], env=plugins.env(), capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["False", "False", "True", "True", "True"], (r.stdout, r.stderr[-2000:])
