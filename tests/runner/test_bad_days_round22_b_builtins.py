"""Bad days, red-team round 22 B22-3, through the CLI: a plugin's (or a flash package's) import that rebinds a builtin
(``builtins.__import__`` wrapped by a careless lazy-import helper, here raising for ``time``) got the NEXT, healthy
import blamed: plugin discovery listed the next plugin broken (``stage`` of it ERROR), env-pairing's flash probe said
FA-3 BROKEN. Discovery put back the warnings filters, the recursion limit, sys.meta_path ..., not the builtins.
Expected: a builtin an import rebound or deleted is put back before the next import (one it added is kept), so the
next plugin / package imports in the process's own state."""

from __future__ import annotations

import json
import subprocess

try:
    from _bad_days import FA2_INIT, cli_cmd, env_with, make, manifest, plant_fa2
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import FA2_INIT, cli_cmd, env_with, make, manifest, plant_fa2

WRAP = """import builtins
_orig = builtins.__import__
def _imp(name, *a, **k):  # a careless import wrapper
    if name == "time":
        raise ImportError("no time for you")
    return _orig(name, *a, **k)
builtins.__import__ = _imp
"""


def _stage(name: str, cls: str, order: int) -> str:
    return (f"from nsa_runner import Stage, StageResult, Status\n"
            f"class {cls}(Stage):\n    name, order, timeout_s = {name!r}, {order}, 60.0\n"
            f"    def run(self, ctx): return StageResult(Status.PASS, {name + ' ok'!r})\n")


def test_a_plugin_rebinding_import_does_not_get_the_next_plugin_blamed(plugins, tmp_path):
    env = make(plugins)
    plugins.make("b22b-plugin", "b22b_mod", "import time\n" + _stage("bb22b", "B", 81), {"bb22b": "b22b_mod:B"})
    # the wrapping plugin in a folder of its own, first on the path: discovery imports it first
    first = tmp_path / "first"
    (first / "a22b_plugin-1.0.dist-info").mkdir(parents=True)
    (first / "a22b_plugin-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: a22b-plugin\n"
                                                                  "Version: 1.0\n")
    (first / "a22b_plugin-1.0.dist-info" / "entry_points.txt").write_text("[nsa_runner.stages]\naa22b = a22b_mod:A\n")
    (first / "a22b_mod.py").write_text(WRAP + _stage("aa22b", "A", 80))
    env = env_with(env, PYTHONPATH=f"{first}:{env['PYTHONPATH']}")
    r = subprocess.run(cli_cmd("list", "--json"), env=env, capture_output=True, text=True, timeout=300)
    listed = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    assert listed["bb22b"]["runs_here"] is True, listed["bb22b"]  # before: "broken: ... ImportError: no time for you"
    assert listed["aa22b"]["runs_here"] is True, listed["aa22b"]
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("stage", "bb22b", "--out", out, "--device", "cpu"), env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [(s["name"], s["status"]) for s in manifest(out)["stages"]] == [("bb22b", "PASS")]



def test_a_flash_package_rebinding_import_does_not_get_the_next_one_blamed(plugins, tmp_path):
    env = make(plugins)
    site = plugins.site
    plant_fa2(site, WRAP + FA2_INIT)
    (site / "flash_attn_interface.py").write_text("import time\ndef flash_attn_func(*a, **k): pass\n")
    out = tmp_path / "out"
    r = subprocess.run(cli_cmd("oneshot", "--only", "env-pairing", "--out", out, "--device", "cpu"),
                       env=env_with(env), capture_output=True, text=True, timeout=300)
    flash = {p["module"]: p for p in json.loads((out / "testrun" / "env.json").read_text())["flash"]}
    fa3 = flash["flash_attn_interface"]
    assert fa3["ok"] is True, (fa3, r.stderr[-2000:])  # before: "import failed: ImportError: no time for you"
    (rec,) = manifest(out)["stages"]
    assert "no time for you" not in rec["reason"], rec
