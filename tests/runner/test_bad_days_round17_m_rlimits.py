"""Bad days, red-team round 17 (part B) B-2, through the CLI: resource limits an impl adapter's code lowers were
not put back by ``impls.adapter_code`` (round 16 B6 put back modes, fds, signals, timers, the recursion limit, cwd,
not ``setrlimit``). A ``select`` leaving RLIMIT_FSIZE at 64 bytes (a library's "safety" limit) cut the stage's log
and result off: selection-map ERROR "exited with code 1 without a result", nsa_core's checks lost, the adapter not
named.

Expected: the limits are put back when the adapter's call ends (a note in the log names them); the next
implementation runs under the runner's own limits, every check recorded.
"""

from __future__ import annotations

import json
import subprocess
import sys

try:
    from _bad_days import MAIN
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN

ADAPTERS = '''
import json, os, resource
from nsa_runner.impls import Impl
from nsa_runner.impls.nsa_core import make

_core = make().parts
STATE = os.environ["M17_STATE"]


def _limits():
    return {n: list(resource.getrlimit(getattr(resource, n))) for n in ("RLIMIT_FSIZE", "RLIMIT_CORE")}


def _leaky(q, k_cmp, cfg):
    out = _core["select"](q, k_cmp, cfg)
    with open(os.path.join(STATE, "before.json"), "w") as f:
        json.dump(_limits(), f)
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return out


def _probe(q, k_cmp, cfg):
    with open(os.path.join(STATE, "after.json"), "w") as f:
        json.dump(_limits(), f)
    return _core["select"](q, k_cmp, cfg)


def leaky():
    return Impl("leaky", {"select": _leaky})


def probe():
    return Impl("probe", {"select": _probe})
'''


def test_resource_limits_an_adapter_lowers_are_put_back(plugins, tmp_path):
    plugins.make("m17-rlim", "m17_rlim", ADAPTERS,
                 {"leaky": "m17_rlim:leaky", "probe": "m17_rlim:probe"}, version="1.0", group="nsa_runner.impls")
    state = tmp_path / "state"
    state.mkdir()
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-c", MAIN, "oneshot", "--only", "selection-map", "--device", "cpu",
                        "--impl", "leaky,probe,nsa_core", "--out", str(out)],
                       env=plugins.env() | {"M17_STATE": str(state)}, text=True, capture_output=True, timeout=600)
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    rec = next(s for s in m["stages"] if s["name"] == "selection-map")
    assert rec["status"] in ("PASS", "FAIL"), (rec, r.stderr[-2000:])  # before: ERROR, no result
    before = json.loads((state / "before.json").read_text())
    after = json.loads((state / "after.json").read_text())
    assert after == before and before["RLIMIT_FSIZE"][0] != 64, (before, after)
    text = (out / "testrun" / "selection_map.txt").read_text()
    for name in ("probe", "nsa_core"):
        lines = [line for line in text.splitlines() if line.strip().startswith("[") and f"{name}:" in line]
        assert len(lines) >= 5 and all(line.strip().startswith("[ok]") for line in lines), (name, text[-3000:])
    log = "".join(p.read_text(errors="replace") for p in (out / "testrun").rglob("*.log"))
    assert "resource.RLIMIT_FSIZE" in log, log[-3000:]
