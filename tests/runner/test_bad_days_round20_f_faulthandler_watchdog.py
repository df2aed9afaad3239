"""Bad days, red-team round 20 (part B) B20-1, through the CLI: a faulthandler watchdog
(``faulthandler.dump_traceback_later(t, exit=True)``) left armed by one plugin's import or by an adapter's call was not
cancelled (round 19 cancels ``signal.alarm`` / itimers only): it ended the discovery child while the NEXT, healthy
plugin was imported (listed broken, ``stage`` of it ERROR), or the stage's process after the adapter returned (ERROR
"exited with code 1 without a result", nsa_core's verdict lost).

Expected: the watchdog is cancelled after each plugin import and each adapter call (the runner never arms one); the
healthy plugin runs, the stage ends with its own verdict.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

try:
    from _bad_days import MAIN
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN

ARMS = "import faulthandler\nfaulthandler.dump_traceback_later(1, exit=True)  # a hang watchdog left armed\n"
SLOW = "import time\ntime.sleep(2)  # a slow import (a big dependency): longer than the watchdog\n"


def _manifest(out: Path) -> dict:
    return json.loads((out / "testrun" / "manifest.json").read_text())


def _plugin(site: Path, mod: str, stage: str, body: str) -> None:
    site.mkdir(parents=True)
    (site / f"{mod}.py").write_text(body + (
        "from nsa_runner import Stage, StageResult, Status\n"
        f"class S(Stage):\n    name = {stage!r}; order = 9\n"
        "    def run(self, ctx): return StageResult(Status.PASS, 'ok')\n"))
    info = site / f"{mod}_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {mod}-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[nsa_runner.stages]\n{stage} = {mod}:S\n")


def test_a_watchdog_one_plugin_import_arms_never_ends_the_next_ones(plugins, tmp_path):
    sites = [tmp_path / "s1", tmp_path / "s2"]
    _plugin(sites[0], "pa20f", "aa20f", ARMS)  # imported first
    _plugin(sites[1], "pb20f", "bb20f", SLOW)
    env = plugins.env()
    env["PYTHONPATH"] = ":".join([*map(str, sites), env["PYTHONPATH"]])
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-c", MAIN, "stage", "bb20f", "--device", "cpu", "--out", str(out)],
                       env=env, text=True, capture_output=True, timeout=600)
    (rec,) = _manifest(out)["stages"]
    # before: ERROR "importing it ended the discovery process (exit code 1 ...)", bb blamed for aa's watchdog
    assert rec["status"] == "PASS", (rec, r.stdout[-2000:], r.stderr[-2000:])
    assert r.returncode == 0


ADAPTER = '''
import faulthandler
import time
from nsa_runner.impls import Impl


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F
    faulthandler.dump_traceback_later(1, exit=True)  # a debugging watchdog left armed
    return F.select_blocks(q, k_cmp, cfg)


_SLEPT = []


def _slow_select(q, k_cmp, cfg):
    from nsa_core import functional as F
    if not _SLEPT:  # its first call only: longer than the watchdog fh left
        _SLEPT.append(1)
        time.sleep(2)
    return F.select_blocks(q, k_cmp, cfg)


def fh():
    return Impl(name="fh", parts={"select": _select}, description="select with a watchdog")


def slow():
    return Impl(name="slow", parts={"select": _slow_select}, description="a slow select")
'''


def test_a_watchdog_an_adapter_arms_is_cancelled_after_its_call(plugins, tmp_path):
    plugins.make("fh-impl", "fhimpl20f", ADAPTER, {"fh": "fhimpl20f:fh", "slow": "fhimpl20f:slow"}, version="0.1",
                 group="nsa_runner.impls")
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-c", MAIN, "stage", "selection-map", "--impl", "fh,slow,nsa_core",
                        "--device", "cpu", "--out", str(out)], env=plugins.env(), text=True, capture_output=True,
                       timeout=600)
    (rec,) = _manifest(out)["stages"]
    log = (out / "testrun" / "logs" / "selection-map.log").read_text(errors="replace")
    # before: ERROR "process exited with code 1 without a result", a "Timeout" faulthandler dump in the log
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:], log[-3000:])
    assert r.returncode == 0
    assert "Timeout (" not in log, log[-3000:]
    assert (out / "testrun" / "selection_map.txt").is_file()
