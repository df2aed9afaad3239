"""Bad days, red-team round 24 B24-2 (its os.getpid form), through the CLI: round 23's guards against a forked copy
(the stage's worker, the discovery child, env-pairing's flash probe) compared ``os.getpid()`` at run time, so a
plugin, stage or flash package that left ``os.getpid`` patched (``unittest.mock.patch("os.getpid").start()``, a test
helper's) made the real process look like a copy: a healthy plugin "ended the discovery process", a PASSing stage
"exited with code 0 without a result", a working FA-2 "crashed the interpreter". Expected: the guards use
``os.getpid`` as it was at nsa-run's import; the plugin's own result stands."""

from __future__ import annotations

import json
import subprocess

try:
    from _bad_days import FA2_INIT, cli_cmd, env_with, manifest, plant_fa2
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import FA2_INIT, cli_cmd, env_with, manifest, plant_fa2

PATCH = 'import unittest.mock\nunittest.mock.patch("os.getpid", return_value=4242).start()\n'

STAGES = """
from nsa_runner import Stage, StageResult, Status

class AtImport(Stage):
    name, order, timeout_s = "gpi", 14, 60.0
    def run(self, ctx):
        return StageResult(Status.PASS, "gpi ok")

class InRun(Stage):
    name, order, timeout_s = "gpr", 15, 60.0
    def run(self, ctx):
        import unittest.mock
        unittest.mock.patch("os.getpid", return_value=4343).start()
        return StageResult(Status.PASS, "gpr ok")
"""


def test_a_plugin_or_stage_leaving_os_getpid_patched_keeps_its_result(plugins, tmp_path):
    plugins.make("gp-stages", "gp_mod", PATCH + STAGES, {"gpi": "gp_mod:AtImport", "gpr": "gp_mod:InRun"})
    env = plugins.env()
    r = subprocess.run(cli_cmd("list", "--json"), env=env, capture_output=True, text=True, timeout=300)
    listed = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    assert listed["gpi"]["runs_here"] is True, listed["gpi"]  # before: broken, "ended the discovery process"
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("oneshot", "--only", "gpi,gpr", "--out", out, "--device", "cpu"), env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    recs = {s["name"]: (s["status"], s["reason"]) for s in manifest(out)["stages"]}
    assert recs == {"gpi": ("PASS", "gpi ok"), "gpr": ("PASS", "gpr ok")}, recs


def test_a_flash_package_leaving_os_getpid_patched_is_probed_as_it_is(plugins, tmp_path):
    site = plugins.site
    plant_fa2(site, PATCH + FA2_INIT)
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("stage", "env-pairing", "--out", out, "--device", "cpu"), env=env_with(plugins.env()),
                       capture_output=True, text=True, timeout=300)
    flash = {p["module"]: p for p in json.loads((out / "testrun" / "env.json").read_text())["flash"]}
    assert flash["flash_attn"]["ok"] is True, (flash["flash_attn"], r.stderr[-2000:])  # before: "crashed"
