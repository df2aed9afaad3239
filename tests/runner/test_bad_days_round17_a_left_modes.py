"""Bad days, red-team round 17 (helper a) item 1, left open by round 16 B6: ``impls.adapter_code`` put back grad
mode, fds, signals, the recursion limit, cwd... but not a torch dispatch mode an adapter entered and never left
(it sees, and may change, every op of the next implementation and of the reference), the random generators'
states (torch's, ``random``'s, numpy's) nor ``os.environ``.

Expected: put back when the adapter's guarded call ends, and named in the stage's log. Checked by state, not by
time: a second adapter (``probe``) run after the leaky one records what it finds, which must be what the leaky
one found before changing it; nsa_core and the probe still pass every check after it.
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
import hashlib, json, os, random
import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from nsa_runner.impls import Impl
from nsa_runner.impls.nsa_core import make

_core = make().parts
STATE = os.environ["R17A_STATE"]


class Skew(TorchDispatchMode):  # every float op's result nudged: the next implementation computes wrong
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.is_floating_point() and func is torch.ops.aten.mul.Tensor:
            out = out * 1.5
        return out


class Seen(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _state():
    return {"dispatch_modes": torch._C._len_torch_dispatch_stack(),
            "function_modes": torch._C._len_torch_function_stack(),
            "torch_rng": hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest(),
            "random": hashlib.sha256(repr(random.getstate()).encode()).hexdigest(),
            "numpy": hashlib.sha256(np.random.get_state()[1].tobytes()).hexdigest(),
            "environ": {k: v for k, v in os.environ.items() if k in ("R17A_ADDED", "R17A_STATE", "PATH", "HOME")}}


def _leaky(q, k_cmp, cfg):
    out = _core["select"](q, k_cmp, cfg)
    with open(os.path.join(STATE, "before.json"), "w") as f:
        json.dump(_state(), f)
    Skew().__enter__()  # entered, never left
    Seen().__enter__()
    torch.manual_seed(1234)
    random.seed(1234)
    np.random.seed(1234)
    os.environ["R17A_ADDED"] = "1"
    os.environ["PATH"] = "/nonexistent"
    os.environ.pop("HOME", None)
    return out


def _probe(q, k_cmp, cfg):
    with open(os.path.join(STATE, "after.json"), "w") as f:
        json.dump(_state(), f)
    return _core["select"](q, k_cmp, cfg)


def leaky():
    return Impl("leaky", {"select": _leaky})


def probe():
    return Impl("probe", {"select": _probe})
'''


def test_dispatch_modes_rng_and_environ_an_adapter_leaves_are_put_back(plugins, tmp_path):
    plugins.make("r17a-leaky", "r17a_leaky", ADAPTERS,
                 {"leaky": "r17a_leaky:leaky", "probe": "r17a_leaky:probe"}, version="1.0", group="nsa_runner.impls")
    state = tmp_path / "state"
    state.mkdir()
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-c", MAIN, "oneshot", "--only", "selection-map", "--device", "cpu",
                        "--impl", "leaky,probe,nsa_core", "--out", str(out)],
                       env=plugins.env() | {"NSA_RUN_ADAPTER_PROCESS": "0", "R17A_STATE": str(state),
                                            "HOME": str(tmp_path)}, text=True,
                       capture_output=True, timeout=600)
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    rec = next(s for s in m["stages"] if s["name"] == "selection-map")
    assert rec["status"] in ("PASS", "FAIL"), (rec, r.stderr[-2000:])
    before = json.loads((state / "before.json").read_text())
    after = json.loads((state / "after.json").read_text())
    assert after == before, {k: (before[k], after.get(k)) for k in before if before[k] != after.get(k)}
    text = (out / "testrun" / "selection_map.txt").read_text()
    for name in ("probe", "nsa_core"):  # judged in the runner's own state: every check holds
        lines = [line for line in text.splitlines() if line.strip().startswith("[") and f"{name}:" in line]
        assert len(lines) >= 5 and all(line.strip().startswith("[ok]") for line in lines), (name, text[-3000:])
    log = "".join(p.read_text(errors="replace") for p in (out / "testrun").rglob("*.log"))
    for what in ("torch's dispatch modes", "torch's random generator state", "the random module's generator state",
                 "numpy's random state", "os.environ"):
        assert what in log, (what, log[-3000:])
