"""Bad days, red-team round 20 (part B) B20-2, through the CLI: env-pairing's flash probe child detected flash_attn,
flash_attn_interface and flash_attn.cute in one process back to back, with nothing put back between them: a timer
flash_attn's import left armed (signal.alarm) killed the child during flash_attn_interface's import, which was blamed
("import crashed the interpreter (exit status -14)"), and FA-4, not even installed, was "BROKEN: not probed".
Expected: what a package's import leaves armed is put back after its detect (FA-3 ok, FA-4 absent); and a package
whose import really kills the child is blamed alone, the packages after it probed in a fresh child."""

from __future__ import annotations

import json
import subprocess

import pytest

try:
    from _bad_days import cli_cmd, env_with, make, manifest, plant_fa2
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, env_with, make, manifest, plant_fa2

FA2 = """\
import signal
{arm}
__version__ = "2.8.3"
def flash_attn_func(*a, **k): pass
def flash_attn_varlen_func(*a, **k): pass
"""
# a slow import (a CUDA extension load) for as long as a timer is armed: with the timer flash_attn left, it is
# killed during this import; with the timer put back, it is not slow at all (no timing in the test)
FA3 = """\
import signal, time
if signal.getitimer(signal.ITIMER_REAL)[0] > 0:
    time.sleep(30)
def flash_attn_func(*a, **k): pass
"""


def _plant(plugins, arm: str) -> dict:
    env = make(plugins)
    site = plugins.site
    plant_fa2(site, FA2.format(arm=arm))
    (site / "flash_attn_interface.py").write_text(FA3)
    return env


def _env_pairing(env, out) -> tuple[dict, dict, str]:
    r = subprocess.run(cli_cmd("oneshot", "--only", "env-pairing", "--out", out, "--device", "cpu", "--timeout", "120"),
                       env=env_with(env), capture_output=True, text=True, timeout=300)
    (rec,) = manifest(out)["stages"]
    doc = json.loads((out / "testrun" / "env.json").read_text())
    return rec, {p["module"]: p for p in doc["flash"]}, r.stderr[-2000:]


@pytest.mark.parametrize("arm", ["signal.alarm(1)", "signal.setitimer(signal.ITIMER_REAL, 0.5)"])
def test_a_timer_left_armed_by_one_flash_package_never_kills_the_next_ones_probe(plugins, tmp_path, arm):
    rec, flash, err = _env_pairing(_plant(plugins, arm), tmp_path / "out")
    fa3, fa4 = flash["flash_attn_interface"], flash["flash_attn.cute"]
    # before: FA-3 "import crashed the interpreter (exit status -14)", FA-4 "not probed (exit status -14)"
    assert fa3["ok"] is True, (fa3, rec["reason"], err)
    assert fa4["not_installed"] is True and fa4["ok"] is False, fa4
    assert flash["flash_attn"]["ok"] is True, flash["flash_attn"]
    assert rec["status"] == "PASS" and "FA-3 ok" in rec["reason"] and "FA-4 absent" in rec["reason"], rec


@pytest.mark.parametrize("crash", ["os._exit(3)", "os.abort()"])
def test_a_flash_package_whose_import_kills_the_interpreter_is_blamed_alone(plugins, tmp_path, crash):
    rec, flash, err = _env_pairing(_plant(plugins, f"import os; {crash}"), tmp_path / "out")
    fa2, fa3, fa4 = flash["flash_attn"], flash["flash_attn_interface"], flash["flash_attn.cute"]
    assert fa2["ok"] is False and fa2["error"].startswith("import crashed the interpreter"), fa2
    # before: both "not probed", BROKEN; now probed in a fresh child
    assert fa3["ok"] is True, (fa3, rec["reason"], err)
    assert fa4["not_installed"] is True, fa4
    assert rec["status"] == "FAIL" and "flash_attn_interface" not in rec["reason"], rec
    assert "flash_attn.cute" not in rec["reason"], rec
    text = (tmp_path / "out" / "testrun" / "env.txt").read_text()
    assert "not probed" not in text and "FA-4          flash_attn.cute: not installed" in text, text
