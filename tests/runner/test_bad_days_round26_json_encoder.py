"""Bad days, red-team round 26 B26-1, through the CLI: ``_stdlib_put`` put back ``json``'s own functions but not those
of ``json.encoder``, which ``json.dumps(..., indent=2)`` looks up at each call; plugin code leaving
``json.encoder.encode_basestring_ascii`` returning bytes, or ``_make_iterencode`` rebound, broke nsa-run's own JSON
writing: a stage's PASS recorded "exited with code 1 without a result", a plugin importing fine listed "ended the
discovery process", an adapter's call lost every selection-map verdict, a flash package was FA-2 "crashed the
interpreter" with the probe's own traceback. Expected: put back after the plugin code like the rest; every result
stands."""

from __future__ import annotations

import subprocess

try:
    from _bad_days import FA2_INIT, cli_cmd, env_pairing_flash, manifest, plant_fa2, running_first
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import FA2_INIT, cli_cmd, env_pairing_flash, manifest, plant_fa2, running_first

ASCII_BYTES = ("import json.encoder\n_e = json.encoder.encode_basestring_ascii\n"
               "json.encoder.encode_basestring_ascii = lambda s: _e(s).encode()\n")
ITERENCODE = ("import json.encoder\n_m = json.encoder._make_iterencode\n"
              "json.encoder._make_iterencode = lambda *a, **k: (lambda o, level: iter([b'{}']))\n")
STAGES = running_first(("A", "r26a", 11, ASCII_BYTES), ("B", "r26b", 12, ITERENCODE))
AT_IMPORT = ASCII_BYTES + """
from nsa_runner import Stage, StageResult, Status

class C(Stage):
    name, order, timeout_s = "r26c", 13, 120.0
    def run(self, ctx):
        return StageResult(Status.PASS, "r26c ok")
"""
ADAPTER = """
from nsa_runner.impls import Impl


def _select(q, k_cmp, cfg):
    exec(%r, {})
    from nsa_core import functional as F
    return F.select_blocks(q, k_cmp, cfg)


IMPL = Impl("r26i", {"select": _select})
""".replace("%r", repr(ASCII_BYTES))


def test_json_encoder_functions_a_stage_left_rebound_are_put_back(plugins, tmp_path):
    plugins.make("r26-stages", "r26_stages", STAGES, {"r26a": "r26_stages:A", "r26b": "r26_stages:B"})
    plugins.make("r26-import", "r26_import", AT_IMPORT, {"r26c": "r26_import:C"})
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("oneshot", "--only", "r26a,r26b,r26c", "--out", out, "--device", "cpu"),
                       env=plugins.env(), capture_output=True, text=True, timeout=900)
    recs = {s["name"]: (s["status"], s["reason"]) for s in manifest(out)["stages"]}
    # before: r26a / r26b ERROR "process exited with code 1 without a result", r26c listed broken
    assert recs == {n: ("PASS", f"{n} ok") for n in ("r26a", "r26b", "r26c")}, (recs, r.stderr[-2000:])


def test_json_encoder_functions_an_adapter_call_left_rebound_are_put_back(plugins, tmp_path):
    plugins.make("r26-adapter", "r26_adapter", ADAPTER, {"r26i": "r26_adapter:IMPL"}, version="1.0",
                 group="nsa_runner.impls")
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("stage", "selection-map", "--impl", "r26i,nsa_core", "--out", out, "--device", "cpu"),
                       env=plugins.env(), capture_output=True, text=True, timeout=900)
    (rec,) = manifest(out)["stages"]
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:])  # before: ERROR "exited ... without a result"
    log = (out / "testrun" / "logs" / "selection-map.log").read_text()
    assert "json.encoder.encode_basestring_ascii" in log, log[-2000:]


def test_json_encoder_functions_a_flash_package_left_rebound_are_put_back(plugins, tmp_path):
    plant_fa2(plugins.site, ASCII_BYTES + FA2_INIT)
    r, flash, _ = env_pairing_flash(plugins, tmp_path)
    assert flash["flash_attn"]["ok"] is True, (flash["flash_attn"], r.stderr[-2000:])  # before: "crashed"
