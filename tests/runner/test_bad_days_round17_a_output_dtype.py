"""Bad days, red-team round 17 (helper a) item 2, round 16 U6: an adapter whose ``selection_attention`` returned
its output in float64 (or float16) for a float32 case PASSed triton-fwd: the output was compared at the case's
tolerance, its dtype never checked against the case's (the contract: "o in q's dtype").

Expected: an output not in its q's dtype is that implementation's BadOutput naming the dtype, never a PASS;
nsa_core's rows of the same stage still PASS.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN

WIDE = '''
import os

import torch
from nsa_runner.impls import Impl
from nsa_runner.impls.nsa_core import make

_core = make().parts
TO = getattr(torch, os.environ["R17A_DTYPE"])


def selection_attention(q, k, v, block_idx, block_count, cfg):
    return _core["selection_attention"](q, k, v, block_idx, block_count, cfg).to(TO)  # right values, wrong dtype


def wide():
    return Impl("wide", {"selection_attention": selection_attention})
'''

CASE = "B1-T40-HQ6"  # the ragged fp32 case of the quick matrix, the smallest


@pytest.mark.parametrize("to", ["float64", "float16"])
def test_an_output_not_in_the_case_dtype_is_the_adapters_bad_output(plugins, tmp_path, to):
    plugins.make("r17a-wide", "r17a_wide", WIDE,
                 {"wide": "r17a_wide:wide"}, version="1.0", group="nsa_runner.impls")
    out = tmp_path / "o"
    r = subprocess.run([sys.executable, "-c", MAIN, "stage", "triton-fwd", "--impl", "wide,nsa_core", "--cases", CASE,
                        "--device", "cpu", "--profile", "quick", "--out", str(out)],
                       env={**plugins.env(), "R17A_DTYPE": to}, text=True, capture_output=True, timeout=600)
    assert "Traceback" not in r.stderr and "(unexpected" not in r.stderr, r.stderr[-3000:]
    st = json.loads((out / "testrun" / "manifest.json").read_text())["stages"][0]
    assert st["status"] != "PASS" and r.returncode != 0, (st, r.returncode)
    rows = {row["impl"]: row for row in csv.DictReader((out / "testrun" / "triton_fwd.csv").open())}
    assert rows["nsa_core"]["status"] == "PASS", rows
    assert rows["wide"]["status"] in ("FAIL", "ERROR"), rows["wide"]
    assert f"has dtype torch.{to}, want torch.float32" in rows["wide"]["note"], rows["wide"]


WIDE_STEP = '''
import torch
from nsa_runner.impls import Impl
from nsa_runner.impls.nsa_core import make

_core = make().parts


def decode_step(*context_cfg_capacity):
    inner = _core["decode_step"](*context_cfg_capacity)

    def step(t, *args):
        o, idx, cnt = inner(t, *args)
        return o.double(), idx, cnt  # right values, float64

    return step


def widestep():
    return Impl("widestep", {"decode_step": decode_step})
'''


def test_decode_bench_a_step_output_not_in_qs_dtype_is_its_error_row(plugins, tmp_path):
    plugins.make("r17a-widestep", "r17a_widestep", WIDE_STEP,
                 {"widestep": "r17a_widestep:widestep"}, version="1.0", group="nsa_runner.impls")
    out = tmp_path / "o"
    r = subprocess.run([sys.executable, "-c", MAIN, "stage", "decode-bench", "--impl", "nsa_core,widestep", "--S-list",
                        "256", "--batch-list", "1", "--iters", "2", "--warmup", "1", "--device", "cpu", "--out",
                        str(out)], env=plugins.env(), text=True, capture_output=True, timeout=600)
    assert "Traceback" not in r.stderr and "(unexpected" not in r.stderr, r.stderr[-3000:]
    st = json.loads((out / "testrun" / "manifest.json").read_text())["stages"][0]
    assert st["status"] != "PASS" and r.returncode != 0, (st, r.returncode)
    text = (out / "testrun" / "decode_bench.txt").read_text()
    assert "widestep S=256 B=1" in text and "o of dtype torch.float64, want torch.float32" in text, text[-3000:]
    rows = {row["impl"]: row for row in csv.DictReader((out / "testrun" / "decode.csv").open())}
    assert rows["nsa_core"]["status"] == "PASS", rows
