"""Bad days, red-team round 17 (helper a) item 3, left open by round 16 B5: prefill-bench and decode-bench handed an
adapter the stage's own input tensors (round 16 gave copies and write detection to the parity stages only). An
``nsa_attention`` that used v_sel as scratch changed what the next implementation was timed on; a ``decode_step``
step that zeroed its q made the float64 reference (computed from the same q after the step) agree with it: PASS.

Expected: the adapter gets copies (made outside the timed calls); the next implementation and the reference read
the stage's tensors as they were made, and a write into an input is that implementation's FAIL naming the input.
Checked by state: a probe adapter after the clobbering one records what it was given.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys

try:
    from _bad_days import MAIN
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN

SRC = '''
import hashlib, json, os

import torch
from nsa_runner.impls import Impl
from nsa_runner.impls.nsa_core import make

_core = make().parts
STATE = os.environ["R17A_STATE"]


def _digest(xs):
    h = hashlib.sha256()
    for x in xs:
        h.update(x.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def _note(name, xs):
    path = os.path.join(STATE, name + ".json")
    if not os.path.exists(path):  # the first call only
        with open(path, "w") as f:
            json.dump(_digest(xs), f)


def clob_attention(q, k_cmp, v_cmp, k_sel, v_sel, k_win, v_win, gates, cfg):
    _note("clob", (q, k_cmp, v_cmp, k_sel, v_sel, k_win, v_win, gates))
    with torch.no_grad():
        v_sel.zero_()  # "scratch"
    return _core["nsa_attention"](q, k_cmp, v_cmp, k_sel, v_sel, k_win, v_win, gates, cfg)


def probe_attention(q, k_cmp, v_cmp, k_sel, v_sel, k_win, v_win, gates, cfg):
    _note("probe", (q, k_cmp, v_cmp, k_sel, v_sel, k_win, v_win, gates))
    return _core["nsa_attention"](q, k_cmp, v_cmp, k_sel, v_sel, k_win, v_win, gates, cfg)


def clob_decode(*context_cfg_capacity):
    inner = _core["decode_step"](*context_cfg_capacity)

    def step(t, q, *rest):
        with torch.no_grad():
            q.zero_()  # the runner's reference then attends with a zero query too
        return inner(t, q, *rest)

    return step


def clobp():
    return Impl("clobp", {"nsa_attention": clob_attention})


def probep():
    return Impl("probep", {"nsa_attention": probe_attention})


def clobd():
    return Impl("clobd", {"decode_step": clob_decode})
'''


def _stage(plugins, tmp_path, *args):
    plugins.make("r17a-bench", "r17a_bench", SRC,
                 {"clobp": "r17a_bench:clobp", "probep": "r17a_bench:probep", "clobd": "r17a_bench:clobd"},
                 version="1.0", group="nsa_runner.impls")
    state, out = tmp_path / "state", tmp_path / "o"
    state.mkdir()
    r = subprocess.run([sys.executable, "-c", MAIN, "stage", *args, "--out", str(out), "--device", "cpu"],
                       env={**plugins.env(), "R17A_STATE": str(state)}, text=True, capture_output=True, timeout=900)
    assert "Traceback" not in r.stderr and "(unexpected" not in r.stderr, r.stderr[-3000:]
    st = json.loads((out / "testrun" / "manifest.json").read_text())["stages"][0]
    assert (r.returncode == 0) == (st["status"] == "PASS"), (r.returncode, st)
    return st, state, out / "testrun"


def test_prefill_bench_an_adapter_writing_into_its_inputs_fails_and_the_next_one_gets_them_intact(plugins, tmp_path):
    st, state, run = _stage(plugins, tmp_path, "prefill-bench", "--impl", "clobp,probep", "--T-list", "128")
    clob = json.loads((state / "clob.json").read_text())
    probe = json.loads((state / "probe.json").read_text())
    assert probe == clob, "probep was given what clobp left, not the stage's inputs"
    assert st["status"] == "FAIL", st
    assert "clobp's nsa_attention wrote into its input v_sel" in st["reason"], st["reason"]
    rows = list(csv.DictReader((run / "prefill.csv").open()))
    assert {r["path"] for r in rows if r["path"] in ("clobp", "probep")} == {"probep"}, rows


def test_decode_bench_a_step_writing_into_its_q_fails_naming_it(plugins, tmp_path):
    st, _, run = _stage(plugins, tmp_path, "decode-bench", "--impl", "nsa_core,clobd", "--S-list", "256",
                        "--batch-list", "1", "--iters", "2", "--warmup", "1")
    assert st["status"] == "FAIL", st
    text = (run / "decode_bench.txt").read_text()
    assert "clobd's step wrote into its input q" in st["reason"] + text, (st["reason"], text[-3000:])
    rows = {r["impl"]: r for r in csv.DictReader((run / "decode.csv").open())}
    assert rows["nsa_core"]["status"] == "PASS" and rows["clobd"]["status"] == "FAIL", rows


