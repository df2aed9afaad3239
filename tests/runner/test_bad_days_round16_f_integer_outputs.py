"""Bad days, red-team round 16 (part B) B1 (and its unclear U1): ``impls.plain_tensor(integer=True)`` took
"integer" as "not floating, not complex, not bool", so a quantized (``torch.qint32``) or bits
(``torch.bits16``) tensor passed as select's block_idx; selection-map's own ``.to(torch.int64)`` then raised
outside the adapter guard: the stage ERRORed, nsa_core's checks were lost and the adapter was not named.
U1, same root: a ``torch.uint64`` block_idx passed too, its 2**64 - 1 padding read back as -1 by that
conversion (a dtype that cannot hold the contract's -1 padding PASSed every check).

Expected: only integer dtypes an int64 holds exactly pass; any other is that adapter's failure, named with
its dtype, and nsa_core's checks are kept.
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
import torch
from nsa_runner.impls import Impl
from nsa_runner.impls.nsa_core import make

_core = make().parts


def _quantized(q, k_cmp, cfg):
    idx, cnt = _core["select"](q, k_cmp, cfg)
    return (torch.quantize_per_tensor(idx.float(), 1.0, 0, torch.qint32),
            torch.quantize_per_tensor(cnt.float(), 1.0, 0, torch.qint32))


def _unsigned64(q, k_cmp, cfg):
    idx, cnt = _core["select"](q, k_cmp, cfg)
    return idx.to(torch.uint64), cnt  # -1 padding becomes 2**64 - 1


def quant():
    return Impl("quant", {"select": _quantized})


def wide():
    return Impl("wide", {"select": _unsigned64})
'''


def _site(plugins) -> None:
    (plugins.site / "r16f_ints.py").write_text(ADAPTERS)
    info = plugins.site / "r16f_ints-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: r16f-ints\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[nsa_runner.impls]\nquant = r16f_ints:quant\nwide = r16f_ints:wide\n")


def test_select_returning_quantized_or_uint64_indices_is_that_adapters_failure(plugins, tmp_path):
    _site(plugins)
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-c", MAIN, "oneshot", "--only", "selection-map", "--device", "cpu",
                        "--impl", "nsa_core,quant,wide", "--out", str(out)],
                       env=plugins.env(), text=True, capture_output=True, timeout=600)
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    rec = next(s for s in m["stages"] if s["name"] == "selection-map")
    # before: ERROR "RuntimeError: Creation of quantized tensor requires quantized dtype ...", no selection_map.txt
    assert rec["status"] == "FAIL", rec
    text = (out / "testrun" / "selection_map.txt").read_text()
    lines = text.splitlines()
    quant = [line for line in lines if "quant" in line and "qint32" in line]
    assert quant, text[-3000:]
    # U1: uint64 indices are refused by their dtype (before: every check of `wide` passed)
    wide = [line for line in lines if "wide" in line and "uint64" in line]
    assert wide, text[-3000:]
    core = [line for line in lines if line.strip().startswith("[") and "quant" not in line
            and "wide" not in line and "SKIP" not in line]
    assert len(core) >= 5 and all(line.strip().startswith("[ok]") for line in core), core
