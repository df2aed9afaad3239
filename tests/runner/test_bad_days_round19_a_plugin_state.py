"""Bad days, red-team round 19 (part B) B19-5, through the CLI: plugin discovery imports every plugin of the group
in one child process; what one plugin's import left changed in that process broke the next, healthy plugin, which
was blamed: p-aa's ``warnings.simplefilter("error")`` turned p-zz's deprecation warning at import into an
exception (``list``: zw broken; ``oneshot --only zw``: ERROR, though aa was never asked for), and an alarm p-aa
armed killed the child while it imported p-zz ("importing it killed the discovery process (SIGALRM)").

Expected: each plugin is imported in the child's own state: what an import leaves changed (warnings filters,
signal handlers, armed alarms / timers, recursion limit, cwd, environment, sys.path, umask, ...) is put back
before the next one. p-aa comes first on sys.path (a folder of its own), so the order is fixed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN, env_with, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with, manifest

CARELESS = """
import os, signal, sys, warnings
warnings.simplefilter("error")
sys.setrecursionlimit(120)
os.umask(0o777)
os.environ["R19A_LEFT"] = "1"
sys.path.insert(0, "/nonexistent-r19a")
signal.setitimer(signal.ITIMER_REAL, 600)  # a self-test watchdog, never cancelled
from nsa_runner import Stage, StageResult, Status
class S(Stage):
    name, order, timeout_s = "aa19", 80, 30.0
    def run(self, ctx): return StageResult(Status.PASS, "aa")
"""
# healthy, but slow to import (heavy dependencies): an alarm left armed fires while it imports (brought forward
# here, so nothing waits); it warns at import (a deprecation notice) and checks the rest of the state it finds
HEALTHY = """
import os, signal, sys, time, warnings
if signal.getitimer(signal.ITIMER_REAL)[0] > 0:
    signal.setitimer(signal.ITIMER_REAL, 0.01)
    time.sleep(30)
warnings.warn("this module's old API is deprecated", UserWarning)
left = [what for what, bad in (("recursion", sys.getrecursionlimit() == 120), ("environ", "R19A_LEFT" in os.environ),
                               ("sys.path", sys.path[:1] == ["/nonexistent-r19a"]), ("umask", os.umask(0o022) == 0o777))
        if bad]
if left:
    raise RuntimeError("state left by another plugin: " + ", ".join(left))
from nsa_runner import Stage, StageResult, Status
class S(Stage):
    name, order, timeout_s = "zw19", 81, 30.0
    def run(self, ctx): return StageResult(Status.PASS, "zw")
"""


def _plugin(site, dist: str, module: str, source: str, entry: str):
    site.mkdir(exist_ok=True)
    (site / f"{module}.py").write_text(source)
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[nsa_runner.stages]\n{entry} = {module}:S\n")


def _env(plugins, tmp_path, alarm: bool):
    first = tmp_path / "first"  # p-aa's folder before p-zz's on sys.path: imported first
    careless = CARELESS if alarm else CARELESS.replace("signal.setitimer(", "# signal.setitimer(")
    _plugin(first, "p-aa19", "m_aa19", careless, "aa19")
    _plugin(plugins.site, "p-zz19", "m_zz19", HEALTHY, "zw19")
    env = env_with(plugins.env(), NSA_RUN_SPARE_WORKER="0")
    env["PYTHONPATH"] = f"{first}:{env['PYTHONPATH']}"
    return env


def _run(env, *args):
    return subprocess.run([sys.executable, "-c", MAIN, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("alarm", [False, True], ids=["warnings-and-more", "armed-alarm"])
def test_b19_5_one_plugins_import_never_breaks_the_next(plugins, tmp_path, alarm):
    env = _env(plugins, tmp_path, alarm)
    r = _run(env, "list", "--json")
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    stages = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    assert stages["zw19"]["runs_here"], stages["zw19"]["why_not"]  # before: broken (UserWarning / SIGALRM)
    assert stages["aa19"]["runs_here"] and stages["sanity"]["runs_here"], stages
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    out = tmp_path / "o"
    r = _run(env, "oneshot", "--only", "zw19", "--out", out)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert [(s["name"], s["status"]) for s in manifest(out)["stages"]] == [("zw19", "PASS")]
