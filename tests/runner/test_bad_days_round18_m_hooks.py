"""Bad days, red-team round 18 (part B) B-3, through the CLI: ``impls.adapter_code`` did not put back autograd's
saved-tensor hooks (nor autocast) an adapter's code left entered: with an offload-style hook left on, the NEXT
implementation's backward failed ("unpack_hook expected to be a Tensor"), nsa_core's row ERROR, blamed on it.

Expected: both put back when the adapter's call ends (a note in the log names them); nsa_core's rows PASS.
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
from nsa_runner.impls import Impl
from nsa_runner.impls.nsa_core import make

_core = make().parts


def _sa(*a, **k):
    out = _core["selection_attention"](*a, **k)
    torch.autograd.graph.saved_tensors_hooks(lambda t: None, lambda p: None).__enter__()  # an offload hook left on
    torch.autocast("cpu", dtype=torch.bfloat16).__enter__()
    return out


def sh():
    return Impl("sh", {"selection_attention": _sa})
'''


def test_saved_tensor_hooks_and_autocast_an_adapter_leaves_on_are_put_back(plugins, tmp_path):
    plugins.make("m18-sh", "m18_sh", ADAPTER, {"sh": "m18_sh:sh"}, version="1.0", group="nsa_runner.impls")
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-c", MAIN, "stage", "triton-bwd", "--cases", "B1-T40", "--impl", "sh,nsa_core",
                        "--device", "cpu", "--out", str(out)], env=plugins.env(), text=True, capture_output=True,
                       timeout=600)
    table = (out / "testrun" / "triton_bwd.csv").read_text()
    rows = [line for line in table.splitlines() if line.startswith("nsa_core,")]
    assert rows and all(",PASS," in line or line.endswith(",PASS") for line in rows), (table, r.stderr[-2000:])
    log = (out / "testrun" / "logs" / "triton-bwd.log").read_text(errors="replace")
    assert "autograd's saved-tensor hooks" in log and "torch's autocast" in log, log[-3000:]
