"""Bad days, red-team round 21 B21-3, through the CLI: a thread one import leaves running (a "load watchdog",
``threading.Timer(2, os._exit, [1])``) ended the shared child during the NEXT import, which was blamed: in plugin
discovery the healthy plugin was listed broken ("importing it ended the discovery process") and ``stage`` of it was
ERROR while the culprit was runnable; in env-pairing's flash probe FA-3 was BROKEN ("import crashed the interpreter")
for FA-2's thread.

Expected: an import during which the child ends while threads earlier imports left are running is imported again
first in a fresh child; fine there, the imports that left the threads are blamed, with that evidence; ending that
child too, it is blamed as before.

No timing: the watchdog thread ends its process as soon as the next import has begun (its module is in
sys.modules), and that import waits for the watchdog thread (a slow import for as long as it runs).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

try:
    from _bad_days import FA2_INIT, MAIN, cli_cmd, env_with, make, manifest, plant_fa2
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import FA2_INIT, MAIN, cli_cmd, env_with, make, manifest, plant_fa2

STAGE = ("from nsa_runner import Stage, StageResult, Status\n"
         "class S(Stage):\n    name = {stage!r}; order = 9\n"
         "    def run(self, ctx): return StageResult(Status.PASS, 'ok')\n")


def watchdog(next_module: str, code: int) -> str:
    """A module body leaving a thread that ends the process (``os._exit(code)``) once ``next_module`` is being
    imported; none when it is imported already."""
    return (f"import os, sys, threading, time\n"
            f"def _watch():\n"
            f"    while {next_module!r} not in sys.modules:\n"
            f"        time.sleep(0.01)\n"
            f"    os._exit({code})\n"
            f"if {next_module!r} not in sys.modules:\n"
            f"    threading.Thread(target=_watch, name='load-watchdog', daemon=True).start()\n")


# a slow import (a big dependency) for as long as a watchdog thread runs; not slow at all in a process of its own
WAITS = ("import threading\n"
         "for _t in list(threading.enumerate()):\n"
         "    if _t.name == 'load-watchdog':\n"
         "        _t.join()\n")


def _plugin(site: Path, mod: str, stage: str, body: str) -> None:
    site.mkdir(parents=True)
    (site / f"{mod}.py").write_text(body + STAGE.format(stage=stage))
    info = site / f"{mod}_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {mod}-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[nsa_runner.stages]\n{stage} = {mod}:S\n")


def _two_plugins(plugins, tmp_path: Path, first: str, second: str) -> dict:
    sites = [tmp_path / "s1", tmp_path / "s2"]  # (imported in this order: sys.path's)
    _plugin(sites[0], "pa21c", "aa21c", first)
    _plugin(sites[1], "pb21c", "bb21c", second)
    env = plugins.env()
    env["PYTHONPATH"] = ":".join([*map(str, sites), env["PYTHONPATH"]])
    return env


def _listed(env: dict) -> dict:
    r = subprocess.run([sys.executable, "-c", MAIN, "list", "--json"], env=env, text=True, capture_output=True,
                       timeout=600)
    doc = json.loads(r.stdout)  # (exit 1 when a stage is broken)
    return {e["name"]: e for e in (doc if isinstance(doc, list) else doc["stages"])}


def test_the_plugin_whose_import_left_the_thread_is_blamed_not_the_next_one(plugins, tmp_path):
    env = _two_plugins(plugins, tmp_path, watchdog("pb21c", 1), WAITS)
    listed = _listed(env)
    aa, bb = listed["aa21c"], listed["bb21c"]
    # before: bb "broken: pb21c:S: importing it ended the discovery process (exit code 1 ...)", aa runnable
    assert bb["runs_here"] is True and not bb["why_not"], bb
    assert aa["runs_here"] is False, aa
    assert "pa21c:S: its import left 1 thread(s) running (Python: load-watchdog)" in aa["why_not"], aa
    assert "ended (exit code 1) while they ran, during a later import (pb21c:S, which imports fine" in aa["why_not"]
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-c", MAIN, "stage", "bb21c", "--device", "cpu", "--out", str(out)],
                       env=env, text=True, capture_output=True, timeout=600)
    (rec,) = manifest(out)["stages"]
    assert rec["status"] == "PASS" and r.returncode == 0, (rec, r.stderr[-2000:])


def test_an_import_that_ends_a_fresh_child_too_is_still_blamed(plugins, tmp_path):
    # aa leaves a harmless thread; bb's import really ends the process: bb broken, aa fine
    idle = ("import threading\n"
            "threading.Thread(target=threading.Event().wait, name='idle', daemon=True).start()\n")
    listed = _listed(_two_plugins(plugins, tmp_path, idle, "import os\nos._exit(3)\n"))
    aa, bb = listed["aa21c"], listed["bb21c"]
    assert aa["runs_here"] is True, aa
    assert bb["runs_here"] is False, bb
    assert "pb21c:S: importing it ended the discovery process (exit code 3" in bb["why_not"], bb



def test_flash_probe_blames_the_package_whose_import_left_the_thread(plugins, tmp_path):
    env = make(plugins)
    site = plugins.site
    plant_fa2(site, watchdog("flash_attn_interface", 0) + FA2_INIT)
    (site / "flash_attn_interface.py").write_text(WAITS + "def flash_attn_func(*a, **k): pass\n")
    out = tmp_path / "out"
    r = subprocess.run(cli_cmd("oneshot", "--only", "env-pairing", "--out", out, "--device", "cpu", "--timeout", "120"),
                       env=env_with(env), capture_output=True, text=True, timeout=300)
    (rec,) = manifest(out)["stages"]
    flash = {p["module"]: p for p in json.loads((out / "testrun" / "env.json").read_text())["flash"]}
    fa2, fa3, fa4 = flash["flash_attn"], flash["flash_attn_interface"], flash["flash_attn.cute"]
    # before: FA-3 "import crashed the interpreter (exit status 0)", FA-2 ok
    assert fa3["ok"] is True, (fa3, rec["reason"], r.stderr[-2000:])
    assert fa4["not_installed"] is True, fa4
    assert fa2["ok"] is False and fa2["error"].startswith(
        "its import left 1 thread(s) running (Python: load-watchdog); the probe process ended (exit status 0) while "
        "they ran, during a later import (flash_attn_interface, which imports fine"), fa2
    assert rec["status"] == "FAIL" and "flash_attn_interface" not in rec["reason"].split(":")[0], rec
