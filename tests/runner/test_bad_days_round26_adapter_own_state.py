"""Bad days, red-team round 26 B26-2, through the CLI: since round 25 (B25-3) ``adapter_code`` puts back what an
adapter's code leaves changed of the standard library, so nsa-run's own code (the stage's checks, prints, JSON
writing) runs in its own state, as round 23 (B23-4) asked for builtins. An adapter whose calls rely on a process-wide
change its *import* made (the common "make my objects JSON serialisable" ``JSONEncoder.default`` patch, a frozen
``time.time`` a forgotten ``freezegun`` start left) therefore fails, and its FAIL blamed the adapter with nothing in
the reason saying nsa-run had undone the change (only a note in the log). The trade-off is decided for nsa-run's own
state (keeping the change for the adapter's calls would keep it for the stage's code inside them too: a
``builtins.print`` made to raise at import would then break nsa_core's checks again). Expected: the FAIL's reason
names what nsa-run put back; the other implementations' verdicts and the stage's own records stand."""

from __future__ import annotations

import subprocess

try:
    from _bad_days import cli_cmd, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, manifest

ADAPTER = """
import json, time

from nsa_runner.impls import Impl


class Cfg:
    def to_json(self):
        return {"block": 64}


_default = json.JSONEncoder.default
json.JSONEncoder.default = lambda self, o: o.to_json() if hasattr(o, "to_json") else _default(self, o)
FROZEN = 1700000000.0
time.time = lambda: FROZEN  # what a freezegun.freeze_time(...).start() left


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    json.dumps({"cfg": Cfg()})  # its own objects, through its own patch
    assert time.time() == FROZEN, f"frozen clock gone: {time.time()}"
    return F.select_blocks(q, k_cmp, cfg)


IMPL = Impl("r26j", {"select": _select})
"""


def test_an_adapter_relying_on_its_imports_process_wide_changes_fails_saying_so(plugins, tmp_path):
    plugins.make("r26-own", "r26_own", ADAPTER, {"r26j": "r26_own:IMPL"}, version="1.0", group="nsa_runner.impls")
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("stage", "selection-map", "--impl", "r26j,nsa_core", "--out", out, "--device", "cpu"),
                       env=plugins.env(), capture_output=True, text=True, timeout=900)
    (rec,) = manifest(out)["stages"]
    assert rec["status"] == "FAIL" and "r26j" in rec["reason"], (rec, r.stderr[-2000:])
    # before: "... select raised TypeError: Object of type Cfg is not JSON serializable", nothing more
    assert "nsa-run put back what adapter imports changed process-wide (r26j's: " in rec["reason"], rec["reason"]
    assert "json.encoder.JSONEncoder.default" in rec["reason"] and "time.time" in rec["reason"], rec["reason"]
    text = (out / "testrun" / "selection_map.txt").read_text()
    lines = [line for line in text.splitlines() if line.strip().startswith("[") and "] nsa_core:" in line]
    assert lines and all(line.strip().startswith("[ok]") for line in lines), text  # nsa_core's verdicts stand
    assert not rec["started"].startswith("2023-11-14"), rec["started"]  # the runner's clock, never the frozen one


ENVIRON = """
import os

from nsa_runner.impls import Impl

os.environ["R27_KERNEL_CACHE"] = "/tmp/r27-cache"  # its import configures its kernels through the environment


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    assert os.environ.get("R27_KERNEL_CACHE"), "no kernel cache configured"
    return F.select_blocks(q, k_cmp, cfg)


IMPL = Impl("r27e", {"select": _select})
"""
BUGGY = """
from nsa_runner.impls import Impl


def _select(q, k_cmp, cfg):
    raise ValueError("r27b's own bug")


IMPL = Impl("r27b", {"select": _select})
"""


def test_the_note_names_each_adapters_own_import_and_any_state_put_back(plugins, tmp_path):
    """Round 27 B27-1: the note named standard-library names only (an adapter relying on its import's os.environ
    change FAILed with nothing said); B27-2: it was process-wide, unattributed: an innocent adapter's own failure
    carried another adapter's note as if its own."""
    plugins.make("r27-env", "r27_env", ENVIRON, {"r27e": "r27_env:IMPL"}, version="1.0", group="nsa_runner.impls")
    plugins.make("r27-bug", "r27_bug", BUGGY, {"r27b": "r27_bug:IMPL"}, version="1.0", group="nsa_runner.impls")
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("stage", "selection-map", "--impl", "r27e,r27b,nsa_core", "--out", out, "--device",
                               "cpu"), env=plugins.env(), capture_output=True, text=True, timeout=900)
    (rec,) = manifest(out)["stages"]
    assert rec["status"] == "FAIL", (rec, r.stderr[-2000:])
    assert "(r27e's: os.environ" in rec["reason"], rec["reason"]  # named, with the adapter whose import did it
    assert "r27b's:" not in rec["reason"], rec["reason"]  # r27b's import changed nothing
