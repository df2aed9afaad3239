"""Bad days, red-team round 16 (part B) B2: ``impls.discovery._check`` (the adapter's factory) and
``_load_one`` (its import, ``ep.load()``) re-raised any ``KeyboardInterrupt`` by ``isinstance`` instead of
round 14's rule ``stops(e)``. An adapter whose factory (or import) raised its own KeyboardInterrupt only in
the stage's process (the import check in a child had passed) ended the whole parity stage "process died
with SIGINT": nsa_core's checks lost, the adapter not named, a signal claimed that no one sent.

Expected: the adapter is broken ("failed to load ...: KeyboardInterrupt: ..."), its rows fail, nsa_core's
checks are kept.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN

ADAPTER = '''
import os
from nsa_runner.impls import Impl
from nsa_runner.impls.nsa_core import make

MARK = os.environ["R16F_KI_MARK"]
WHERE = os.environ["R16F_KI_WHERE"]
if WHERE == "import":
    if os.path.exists(MARK):  # the child's import check has passed: the stage's own import raises
        raise KeyboardInterrupt("from import")
    open(MARK, "w").close()


def ki():
    if WHERE == "factory":
        if os.path.exists(MARK):
            raise KeyboardInterrupt("from factory")
        open(MARK, "w").close()
    return Impl("ki", {"select": make().parts["select"]})
'''


@pytest.mark.parametrize("where", ["factory", "import"])
def test_an_adapters_own_keyboard_interrupt_breaks_that_adapter_only(plugins, tmp_path, where):
    (plugins.site / "r16f_ki.py").write_text(ADAPTER)
    info = plugins.site / "r16f_ki-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: r16f-ki\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[nsa_runner.impls]\nki = r16f_ki:ki\n")
    env = plugins.env() | {"R16F_KI_MARK": str(tmp_path / "mark"), "R16F_KI_WHERE": where}
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-c", MAIN, "oneshot", "--only", "selection-map", "--device", "cpu",
                        "--impl", "nsa_core,ki", "--out", str(out)],
                       env=env, text=True, capture_output=True, timeout=600)
    # the child's import check ran first and passed
    assert (tmp_path / "mark").exists(), r.stdout[-2000:] + r.stderr[-3000:]
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    rec = next(s for s in m["stages"] if s["name"] == "selection-map")
    # before: ERROR "process died with SIGINT", no selection_map.txt
    assert rec["status"] == "FAIL", rec
    assert "SIGINT" not in rec["reason"], rec
    text = (out / "testrun" / "selection_map.txt").read_text()
    ki = [line for line in text.splitlines() if "ki" in line and "KeyboardInterrupt" in line]
    assert ki and f"from {where}" in ki[0], text[-3000:]
    core = [line for line in text.splitlines() if line.strip().startswith("[") and "nsa_core" in line]
    assert len(core) >= 5 and all(line.strip().startswith("[ok]") for line in core), core
