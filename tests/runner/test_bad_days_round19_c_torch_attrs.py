"""Bad days, red-team round 19 (part B) B19-4, through the CLI: ``impls.adapter_code`` put back grad mode, dispatch
modes, RNG, hooks, autocast... an adapter's code left changed, but not a torch function it rebound: an adapter
installing a "fast" bf16 softmax process-wide (``torch.softmax = fast``) made the NEXT implementation, nsa_core, FAIL
(rel_err 2.4e-03), blamed on it, nothing in the log; with ``--impl nsa_core,mp`` nsa_core passed.

Expected: the attributes of torch / torch.nn.functional / torch.Tensor (and torch.linalg / torch.special ...) an
adapter rebinds or deletes (or adds over one of torch's, ``torch.Tensor.softmax`` over TensorBase's) are put back after
its call, a note in the log names them; nsa_core PASSes.
"""

from __future__ import annotations

import subprocess
import sys

try:
    from _bad_days import MAIN
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN

ADAPTER = '''
import torch
import torch.nn.functional as F
from nsa_runner.impls import Impl
from nsa_runner.impls.nsa_core import make

_core = make().parts
_orig = torch.softmax
_orig_f = F.softmax


def _fast_softmax(x, dim=None, dtype=None, **k):  # "faster" softmax in bf16, installed process-wide
    return _orig(x.to(torch.bfloat16), dim).to(x.dtype)


def _fast_f(x, dim=None, *a, **k):
    return _orig_f(x.to(torch.bfloat16), dim).to(x.dtype)


def _wrap():
    out = {}
    for k, f in _core.items():
        def g(*a, _f=f, **kw):
            torch.softmax = _fast_softmax
            F.softmax = _fast_f
            torch.Tensor.softmax = lambda self, dim, *a, **k: _fast_softmax(self, dim)
            torch.m19_added = "left by mp"
            return _f(*a, **kw)
        out[k] = g
    return out


def mp():
    return Impl("mp", _wrap())
'''


def test_torch_functions_an_adapter_rebinds_are_put_back_and_named(plugins, tmp_path):
    plugins.make("m19-mp", "m19_mp", ADAPTER, {"mp": "m19_mp:mp"}, version="1.0", group="nsa_runner.impls")
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-c", MAIN, "stage", "triton-fwd", "--cases", "B1-T40", "--impl", "mp,nsa_core",
                        "--device", "cpu", "--out", str(out)], env=plugins.env(), text=True, capture_output=True,
                       timeout=600)
    table = (out / "testrun" / "triton_fwd.csv").read_text()
    rows = [line for line in table.splitlines() if line.startswith("nsa_core,")]
    assert rows and all(",PASS," in line or line.endswith(",PASS") for line in rows), (table, r.stderr[-2000:])
    log = (out / "testrun" / "logs" / "triton-fwd.log").read_text(errors="replace")
    note = [line for line in log.splitlines() if line.startswith("note: an implementation's code left")]
    assert note, log[-3000:]
    assert any("torch.softmax" in line and "torch.nn.functional.softmax" in line and "torch.Tensor.softmax" in line
               for line in note), note
    # a new name torch does not have hides nothing of torch's: kept by design since round 20 B20-4 (a library's
    # import adds its helpers once and uses them later), so it is not in the put-back note
    assert not any("torch.m19_added" in line for line in note), note
