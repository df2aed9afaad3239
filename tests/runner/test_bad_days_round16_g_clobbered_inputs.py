"""Bad days, red-team round 16 (part B) B5: the parity stages handed an adapter's part the stage's own input
tensors, then computed the float64 reference (and ran the next implementation) from the *same* tensors after
the part returned. A kernel that uses an input as scratch was compared with the reference of whatever it left
there: ``v.zero_(); return zeros`` -> triton-fwd PASS with rel_err 0; ``block_count.zero_()`` -> triton-bwd
PASS; a ``select`` that overwrote q / k_cmp -> selection-map and sanity PASS on constants instead of the sample.

Expected: a part gets copies of its own (the reference and the other implementations read inputs it never
held), and one that wrote into an input is that implementation's FAIL naming the input.
"""

from __future__ import annotations

import json
import subprocess
import sys

try:
    from _bad_days import MAIN
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN

CLOB = '''
import os

import torch
from nsa_runner.impls import Impl
from nsa_runner.impls.nsa_core import make

_core = make().parts
MODE = os.environ.get("R16G_MODE", "")


class _ZeroGrads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        ctx.shapes = (q.shape, k.shape, v.shape)
        return torch.zeros(q.shape[:3] + (v.shape[-1],), dtype=q.dtype)

    @staticmethod
    def backward(ctx, do):
        do.zero_()  # scribbles over the caller's do: the reference's gradients become zeros too
        return tuple(torch.zeros(s, dtype=do.dtype) for s in ctx.shapes)


def selection_attention(q, k, v, block_idx, block_count, cfg):
    if MODE == "v":
        with torch.no_grad():
            v.zero_()  # "scratch": the caller's v is now zeros
        return torch.zeros(q.shape[:3] + (v.shape[-1],), dtype=q.dtype)  # and the answer is zeros
    if MODE.startswith("idx"):
        block_count.zero_()
        block_idx.fill_(-1)  # the reference then selects no block: zeros everywhere
        return torch.zeros(q.shape[:3] + (v.shape[-1],), dtype=q.dtype) + 0 * (q.sum() + k.sum() + v.sum())
    if MODE == "do":
        return _ZeroGrads.apply(q, k, v)
    return _core["selection_attention"](q, k, v, block_idx, block_count, cfg)


def select(q, k_cmp, cfg):
    with torch.no_grad():
        q.fill_(1.0)
        k_cmp.fill_(1.0)  # overwrite the caller's sample
    return _core["select"](q, k_cmp, cfg)


def clob():
    parts = {"selection_attention": selection_attention}
    if MODE.endswith("select"):
        parts = {**({} if MODE == "select" else parts), "select": select}
    return Impl("clob", parts)
'''


def _site(plugins) -> None:
    (plugins.site / "r16g_clob.py").write_text(CLOB)
    info = plugins.site / "r16g_clob-1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: r16g-clob\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[nsa_runner.impls]\nclob = r16g_clob:clob\n")


def _stage(plugins, out, mode: str, *args: str) -> dict:
    _site(plugins)
    env = {**plugins.env(), "R16G_MODE": mode}
    r = subprocess.run([sys.executable, "-c", MAIN, "stage", *args, "--device", "cpu", "--profile", "quick",
                        "--out", str(out)], env=env, text=True, capture_output=True, timeout=600)
    assert "Traceback" not in r.stderr and "(unexpected" not in r.stderr, r.stderr[-3000:]
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    st = m["stages"][0]
    assert (r.returncode == 0) == (st["status"] == "PASS"), (r.returncode, st)
    return st


CASE = "B1-T40-HQ6"  # the ragged fp32 case of the quick matrix, the smallest


def test_a_kernel_that_zeros_v_and_returns_zeros_fails_triton_fwd_naming_v(plugins, tmp_path):
    st = _stage(plugins, tmp_path / "o", "v", "triton-fwd", "--impl", "clob", "--cases", CASE)
    assert st["status"] == "FAIL", st
    assert "clob's selection_attention wrote into its input v" in st["reason"], st["reason"]
    rows = (tmp_path / "o" / "testrun" / "triton_fwd.csv").read_text()
    assert "wrote into its input v" in rows
    # measured against the reference of the inputs it was given, not of the zeros it left: rel_err 1
    assert st["metrics"]["worst_rel_err"] > 0.5, st["metrics"]


def test_a_kernel_that_clears_the_selection_fails_triton_fwd_and_bwd_naming_it(plugins, tmp_path):
    for stage in ("triton-fwd", "triton-bwd"):
        st = _stage(plugins, tmp_path / stage, "idx", stage, "--impl", "clob", "--cases", CASE)
        assert st["status"] == "FAIL", (stage, st)
        assert "wrote into its inputs block_idx, block_count" in st["reason"], (stage, st["reason"])
        assert st["metrics"]["worst_rel_err"] > 0.5, (stage, st["metrics"])


def test_a_backward_that_zeros_the_output_gradient_fails_triton_bwd_naming_do(plugins, tmp_path):
    st = _stage(plugins, tmp_path / "o", "do", "triton-bwd", "--impl", "clob", "--cases", CASE)
    assert st["status"] == "FAIL", st
    assert "wrote into its input do" in st["reason"], st["reason"]
    assert st["metrics"]["worst_rel_err"] > 0.5, st["metrics"]


def test_a_select_that_overwrites_the_sample_fails_selection_map_and_nsa_core_sees_the_sample(plugins, tmp_path):
    st = _stage(plugins, tmp_path / "o", "select", "selection-map", "--impl", "clob,nsa_core", "--T", "128")
    assert st["status"] == "FAIL", st
    assert "clob's select wrote into its inputs q, k_cmp" in st["reason"], st["reason"]
    text = (tmp_path / "o" / "testrun" / "selection_map.txt").read_text()
    # nsa_core's checks ran on the seeded sample and hold
    assert "[FAIL] nsa_core" not in text, text
    assert "[ok] nsa_core: count == min(n, t // l' + 1)" in text, text


def test_parts_that_overwrite_their_inputs_fail_sanity_naming_them(plugins, tmp_path):
    st = _stage(plugins, tmp_path / "o", "idx+select", "sanity", "--impl", "clob", "--seed", "1")
    assert st["status"] == "FAIL", st
    doc = json.loads((tmp_path / "o" / "testrun" / "sanity.json").read_text())
    failed = {r["check"]: r["detail"] for r in doc["checks"] if not r["ok"]}
    # the select check read the sample it made, not the ones clob's select left (rows identical before)
    assert "clob's select wrote into its inputs q, k_cmp" in failed.get("clob select inputs", ""), failed
    assert "wrote into its inputs block_idx, block_count" in failed.get("clob slc inputs", ""), failed
    assert "clob slc inputs" in st["reason"], st["reason"]
