"""Bad days, red-team round 16 (part B) B6: the adapter guard (``impls.adapter_code``) put back the SIGINT handler
only. Process-wide state an adapter's part left changed stayed changed for every later check of the stage:
``torch.set_grad_enabled(False)`` in a ``select`` made the *next* implementation's backward check FAIL
(nsa_core's included, blamed on it); fds 1 / 2 closed, a recursion limit left just above the adapter's depth
or an armed ``signal.alarm`` ended the whole stage (nsa_core's checks lost, the adapter not named).

Expected: what the adapter's code left changed is put back when its guarded call ends: the next
implementation runs in the runner's own state. Checked by state, not by time: a second adapter (``probe``)
run after the leaky one records what it finds, which must be what the leaky one found before changing it.
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
import json, os, signal, sys
import torch
from nsa_runner.impls import Impl
from nsa_runner.impls.nsa_core import make

_core = make().parts
HELD = []
STATE = os.environ["R16F_STATE"]


def _fd(fd):
    try:
        st = os.fstat(fd)
        return [st.st_dev, st.st_ino]
    except OSError:
        return None


def _state():
    return {"grad": torch.is_grad_enabled(), "inference": torch.is_inference_mode_enabled(),
            "dtype": str(torch.get_default_dtype()), "device": str(torch.get_default_device()),
            "deterministic": torch.are_deterministic_algorithms_enabled(), "threads": torch.get_num_threads(),
            "function_modes": torch._C._len_torch_function_stack(), "recursion": sys.getrecursionlimit(),
            "alarm": list(signal.getitimer(signal.ITIMER_REAL)),
            "sigalrm": signal.getsignal(signal.SIGALRM) is signal.SIG_DFL,
            "fds": [_fd(0), _fd(1), _fd(2)], "cwd": os.getcwd()}


def _depth():
    f, n = sys._getframe(), 0
    while f is not None:
        f, n = f.f_back, n + 1
    return n


def _leaky(q, k_cmp, cfg):
    out = _core["select"](q, k_cmp, cfg)
    with open(os.path.join(STATE, "before.json"), "w") as f:
        json.dump(_state(), f)
    torch.set_grad_enabled(False)  # an ordinary bug: autograd left off
    HELD.append(torch._C._InferenceMode(True))  # an inference-mode guard kept alive
    torch.set_default_dtype(torch.float64)
    torch.set_default_device("meta")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    signal.signal(signal.SIGALRM, lambda *a: os._exit(7))
    signal.alarm(300)  # a library's timeout left armed
    os.chdir("/")
    os.close(1)
    os.close(2)
    sys.setrecursionlimit(_depth() + 8)  # just above this depth: the stage's next deeper call fails
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


def test_what_an_adapter_leaves_changed_is_put_back_before_the_next_one(plugins, tmp_path):
    (plugins.site / "r16f_leaky.py").write_text(ADAPTERS)
    info = plugins.site / "r16f_leaky-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: r16f-leaky\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[nsa_runner.impls]\nleaky = r16f_leaky:leaky\nprobe = r16f_leaky:probe\n")
    state = tmp_path / "state"
    state.mkdir()
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-c", MAIN, "oneshot", "--only", "selection-map", "--device", "cpu",
                        "--impl", "leaky,probe,nsa_core", "--out", str(out)],
                       env=plugins.env() | {"NSA_RUN_ADAPTER_PROCESS": "0", "R16F_STATE": str(state)},
                       text=True, capture_output=True, timeout=600)
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    rec = next(s for s in m["stages"] if s["name"] == "selection-map")
    # before: ERROR (the stage's next print on the closed fd / its next call past the recursion limit)
    assert rec["status"] in ("PASS", "FAIL"), (rec, r.stderr[-2000:])
    before = json.loads((state / "before.json").read_text())
    after = json.loads((state / "after.json").read_text())
    assert after == before, {k: (before[k], after.get(k)) for k in before if before[k] != after.get(k)}
    text = (out / "testrun" / "selection_map.txt").read_text()
    for name in ("probe", "nsa_core"):  # judged in the runner's own state: every check holds
        lines = [line for line in text.splitlines() if line.strip().startswith("[") and f"{name}:" in line]
        assert len(lines) >= 5 and all(line.strip().startswith("[ok]") for line in lines), (name, text[-3000:])
    log = "".join(p.read_text(errors="replace") for p in (out / "testrun").rglob("*.log"))
    assert "torch's grad mode" in log and "fd 1" in log, log[-3000:]
