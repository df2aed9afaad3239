"""Bad days, red-team round 14 (part B) R2, what was left: an adapter raising the runner's REAL interrupt
class (``nsa_runner.executor.Terminated``, imported from the runner itself) where no signal came was
taken for the runner's own termination (``impls.stops`` compared the class by identity only): the
stage's worker ended "without a result", every adapter's results lost.

Expected: an interrupt the process's own handlers did not receive is the adapter's failure (that impl's
ERROR, its traceback in the log), the stage goes on with the other implementations and the run ends.
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

REAL_TERM_IMPL = """
from nsa_runner.executor import Terminated, _Interrupted
from nsa_runner.impls import Constraints, Impl
from nsa_runner.impls.nsa_core import make
def _check(case, part):
    raise Terminated(15)
REALTERM = lambda: Impl("realterm", {"select": make().parts["select"]}, Constraints(check=_check))
"""


def _dist(site: Path, module: str, source: str, entries: str) -> None:
    (site / f"{module}.py").write_text(source)
    info = site / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[nsa_runner.impls]\n" + entries)


def test_an_adapter_raising_the_real_terminated_without_a_signal_is_its_own_failure(plugins, tmp_path):
    _dist(plugins.site, "r15k_realterm", REAL_TERM_IMPL, "realterm = r15k_realterm:REALTERM\n")
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-c", MAIN, "oneshot", "--only", "selection-map", "--device", "cpu",
                        "--impl", "nsa_core,realterm", "--out", str(out)],
                       env=plugins.env(), text=True, capture_output=True, timeout=600)
    assert "Traceback" not in r.stderr and "(unexpected" not in r.stderr, r.stderr[-3000:]
    assert r.returncode != 130, r.stderr[-2000:]
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    assert m["finished"] and not m.get("interrupted"), m
    rec = next(s for s in m["stages"] if s["name"] == "selection-map")
    assert "without a result" not in rec["reason"] and "interrupted" not in rec["reason"], rec["reason"]
    assert rec["status"] in ("PASS", "FAIL"), (rec["status"], rec["reason"])
    text = "\n".join(p.read_text(errors="replace") for p in (out / "testrun").glob("selection_map*"))
    assert "realterm" in text and "Terminated" in text, text[-2000:]
    assert "nsa_core" in text  # the other implementation's results kept
