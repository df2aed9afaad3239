"""Bad days, red-team round 24 B24-2 (its standard-library forms), through the CLI: nsa-run's own code in a process
that also runs plugin code called ``json.dumps`` / ``os.replace`` as the plugin left them. A stage whose code left an
orjson-style ``json.dumps`` (returning bytes) or ``os.replace`` mocked was recorded "exited with code 1 / 0 without a
result" (its PASS lost); a plugin whose import installed the shim was listed "ended the discovery process"; a flash
package doing it at import was "BROKEN: import crashed the interpreter". Expected: the standard library's functions
are put back after the plugin code, before nsa-run's code runs again (``nsa_runner/_stdlib_put.py``)."""

from __future__ import annotations

import json
import subprocess

try:
    from _bad_days import FA2_INIT, cli_cmd, env_with, manifest, plant_fa2
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import FA2_INIT, cli_cmd, env_with, manifest, plant_fa2

SHIM = "import json\n_d = json.dumps\njson.dumps = lambda o, *a, **k: _d(o).encode()  # orjson-style: bytes\n"

STAGES = SHIM + """
from nsa_runner import Stage, StageResult, Status

class AtImport(Stage):
    name, order, timeout_s = "sji", 14, 60.0
    def run(self, ctx):
        return StageResult(Status.PASS, "sji ok")

class InRun(Stage):
    name, order, timeout_s = "sjr", 15, 60.0
    def run(self, ctx):
        import os, unittest.mock
        unittest.mock.patch("os.replace").start()  # a test helper's patch left on
        json.dumps = lambda o, *a, **k: b"{}"
        return StageResult(Status.PASS, "sjr ok")
"""


def test_a_plugin_or_stage_leaving_json_dumps_or_os_replace_rebound_keeps_its_result(plugins, tmp_path):
    plugins.make("sj-stages", "sj_mod", STAGES, {"sji": "sj_mod:AtImport", "sjr": "sj_mod:InRun"})
    env = plugins.env()
    r = subprocess.run(cli_cmd("list", "--json"), env=env, capture_output=True, text=True, timeout=300)
    listed = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    assert listed["sji"]["runs_here"] is True, listed["sji"]  # before: "ended the discovery process (exit code 1"
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("oneshot", "--only", "sji,sjr", "--out", out, "--device", "cpu"), env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    recs = {s["name"]: (s["status"], s["reason"]) for s in manifest(out)["stages"]}
    assert recs == {"sji": ("PASS", "sji ok"), "sjr": ("PASS", "sjr ok")}, recs
    log = (out / "testrun" / "logs" / "sjr.log").read_text()
    assert "json.dumps" in log and "os.replace" in log and "put back" in log, log[-2000:]


def test_a_flash_package_leaving_json_dumps_rebound_is_probed_as_it_is(plugins, tmp_path):
    site = plugins.site
    plant_fa2(site, SHIM + FA2_INIT)
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("stage", "env-pairing", "--out", out, "--device", "cpu"), env=env_with(plugins.env()),
                       capture_output=True, text=True, timeout=300)
    flash = {p["module"]: p for p in json.loads((out / "testrun" / "env.json").read_text())["flash"]}
    assert flash["flash_attn"]["ok"] is True, (flash["flash_attn"], r.stderr[-2000:])  # before: "crashed"
