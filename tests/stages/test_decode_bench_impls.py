"""decode-bench per implementation (issue 15): ``--impl`` runs the decode step of each chosen
implementation that has a ``decode_step`` part (contract: ``nsa_runner.impls.DECODE_STEP``) on the
same points as nsa_core. A fake implementation plugin (a module plus a dist-info on sys.path, as pip
leaves it) written independently in plain torch passes decode-bench's checks; the same plugin with a
planted bug (the window one token too wide, the best free block swapped for the next one) FAILs naming
the point and step; fla, which has no decode step, is SKIP naming the reason; a step that returns the
wrong shape or raises is ERROR and fails the stage. Points not run are listed in decode_bench.txt,
decode_summary.txt and the stage's reason; decode.csv holds the measured rows."""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

if not torch.cuda.is_available():  # as the executor does: before triton is first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

from nsa_runner.stage import Status  # noqa: E402
from stages import decode_bench  # noqa: E402
from stages.decode_bench import COLUMNS, DecodeBench  # noqa: E402

# A third-party decode step in plain torch (its own cache, its own Eqs. 7-12), not nsa_core's code.
# BUG = "window": the window holds w + 1 tokens; BUG = "block": the best non-forced block is swapped for
# the next best one.
KERNEL = '''
import torch
from nsa_runner.impls import Constraints, Impl

BUG = {bug!r}


def decode_step(k_cmp, v_cmp, k_sel, v_sel, k_win, v_win, cfg, capacity):
    B, t0, G, _ = k_sel.shape
    ctx = (k_cmp, v_cmp, k_sel, v_sel, k_win, v_win)
    cache = [torch.zeros(B, capacity, G, x.shape[-1], dtype=x.dtype, device=x.device) for x in ctx]
    for c, x in zip(cache, ctx):
        c[:, :t0] = x

    def attend(q, k, v):  # q [B, G, h, dk] float64; k/v [B, N, G, d] -> o [B, G, h, dv], p [B, G, h, N]
        if k.shape[1] == 0:
            return q.new_zeros(*q.shape[:3], v.shape[-1]), q.new_zeros(*q.shape[:3], 0)
        p = torch.softmax(torch.einsum("bghd,bngd->bghn", q, k.double()) / q.shape[-1] ** 0.5, -1)
        return torch.einsum("bghn,bngd->bghd", p, v.double()), p

    def step(t, q, kc, vc, ks, vs, kw, vw, gates):
        for c, x in zip(cache, (kc, vc, ks, vs, kw, vw)):
            c[:, t] = x[:, 0]
        s, HQ = t + 1, q.shape[2]
        qg = q[:, 0].double().view(B, G, HQ // G, -1)
        K_c, V_c, K_s, V_s, K_w, V_w = (c[:, :s] for c in cache)
        nc = 0 if s < cfg.l else (s - cfg.l) // cfg.d + 1  # compressed tokens visible at t (mean of l tokens)
        cmp_k = torch.stack([K_c[:, i * cfg.d:i * cfg.d + cfg.l].mean(1) for i in range(nc)], 1) if nc else K_c[:, :0]
        cmp_v = torch.stack([V_c[:, i * cfg.d:i * cfg.d + cfg.l].mean(1) for i in range(nc)], 1) if nc else V_c[:, :0]
        o_cmp, p = attend(qg, cmp_k, cmp_v)
        P = p.sum(2)  # [B, G, nc]: the group's heads summed (Eq. 10)
        a, b, cur = cfg.l_sel // cfg.d, cfg.l // cfg.d, t // cfg.l_sel
        score = torch.zeros(B, G, cur + 1, dtype=torch.float64)
        for j in range(cur + 1):  # Eq. 9 (overlap form): sum over m < a, n < b of p_cmp[j a + m - n]
            for m in range(a):
                for n in range(b):
                    i = j * a + m - n
                    if 0 <= i < nc:
                        score[..., j] += P[..., i]
        forced = sorted({{0, cur, max(cur - 1, 0)}})
        free = cfg.n_sel - len(forced)
        idx = torch.full((B, G, cfg.n_sel), -1, dtype=torch.int32)
        cnt = torch.zeros(B, G, dtype=torch.int32)
        o_slc = qg.new_zeros(o_cmp.shape)
        for bb in range(B):
            for g in range(G):
                others = [j for j in sorted(range(cur + 1), key=lambda j: (-float(score[bb, g, j]), j))
                          if j not in forced]
                pick = others[:free]
                if BUG == "block" and len(others) > free:
                    pick = others[1:free + 1]
                chosen = sorted(forced + pick)
                idx[bb, g, :len(chosen)] = torch.tensor(chosen, dtype=torch.int32)
                cnt[bb, g] = len(chosen)
                toks = torch.cat([torch.arange(j * cfg.l_sel, min(s, (j + 1) * cfg.l_sel)) for j in chosen])
                o_slc[bb, g] = attend(qg[bb:bb + 1, g:g + 1], K_s[bb:bb + 1, toks][:, :, g:g + 1],
                                      V_s[bb:bb + 1, toks][:, :, g:g + 1])[0][0, 0]
        lo = max(0, t - cfg.w + (0 if BUG == "window" else 1))
        o_win, _ = attend(qg, K_w[:, lo:], V_w[:, lo:])
        gt = gates[:, 0].double().view(B, G, HQ // G, 3)
        o = gt[..., 0:1] * o_cmp + gt[..., 1:2] * o_slc + gt[..., 2:3] * o_win
        return o.reshape(B, 1, HQ, -1).to(q.dtype), idx[:, None], cnt[:, None]

    return step


IMPL = Impl("{name}", {{"decode_step": decode_step}}, Constraints(dtypes=("fp32", "fp16")))
'''
OTHERS = '''
import torch
from nsa_runner.impls import Impl


def short_step(*ctx_cfg):
    def step(t, q, *rest):
        return q[..., :1], None, None  # wrong shape: o must be [B, 1, HQ, dv]
    return step


def raising_step(*ctx_cfg):
    raise RuntimeError("no kernel for this GPU")


SHORT = Impl("shortdec", {"decode_step": short_step})
RAISE = Impl("raisedec", {"decode_step": raising_step})
SELONLY = Impl("selonlydec", {"selection_attention": lambda *a: None})
'''


def _install(plugins, dist: str, module: str, source: str, impls: dict[str, str]) -> None:
    (plugins.site / f"{module}.py").write_text(textwrap.dedent(source))
    info = plugins.site / f"{dist.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[nsa_runner.impls]\n" + "".join(f"{k} = {v}\n" for k, v in impls.items()))
    importlib.invalidate_caches()
    sys.modules.pop(module, None)


@pytest.fixture
def fakes(plugins):
    for name, bug in (("gooddec", ""), ("windec", "window"), ("blockdec", "block")):
        _install(plugins, f"{name}-kernels", f"{name}_kernels", KERNEL.format(bug=bug, name=name),
                 {name: f"{name}_kernels:IMPL"})
    _install(plugins, "odd-kernels", "odd_kernels", OTHERS,
             {"shortdec": "odd_kernels:SHORT", "raisedec": "odd_kernels:RAISE", "selonlydec": "odd_kernels:SELONLY"})
    return plugins


def _ctx(tmp_path, **opts):
    options = {o.dest: o.default for o in DecodeBench.options}
    options.update(dict(S_list=[300], batch_list=[2], iters=1, warmup=0, profile_passes=1), **opts)
    return SimpleNamespace(dir=tmp_path, device="cpu", profile="quick", options=options, run_id="t")


def test_a_correct_decode_step_passes_beside_nsa_core_and_fla_is_skipped(fakes, tmp_path):
    res = DecodeBench().run(_ctx(tmp_path, impl="nsa_core,gooddec,fla"))
    assert res.status == Status.PASS, res.reason
    assert "gooddec: 1 points" in res.reason and "fla: does not provide decode_step" in res.reason
    df = pd.read_csv(tmp_path / "decode.csv")
    assert list(df.columns) == COLUMNS and list(df.impl) == ["nsa_core", "gooddec"]
    core, good = (df[df.impl == n].iloc[0] for n in ("nsa_core", "gooddec"))
    from nsa_core import NSAConfig
    from nsa_core.decode.cache import formula_reads

    want = formula_reads(300, NSAConfig(**decode_bench.parse_nsa(decode_bench.DEFAULTS["cpu"]["nsa"])))
    for r in (core, good):  # both measured: the same counters, parity within tolerance, timed against full
        assert r.status == "PASS" and (r.reads_cmp, r.reads_sel, r.reads_win) == (want["cmp"], want["sel"], want["win"])
        assert r.parity_rel_err <= r.parity_tol and r.sel_agree == 1.0 and r.ms_attn > 0 and r.ms_full > 0
        assert r.speedup == pytest.approx(r.ms_full / r.ms_attn)
    assert core.kernel == "torch" and core.share_sum == pytest.approx(100.0, abs=1e-6)  # nsa_core's shares intact
    assert good.kernel == "decode_step" and pd.isna(good.ms_step) and pd.isna(good.share_sum)
    assert "8 steps checked (t=292..299)" in good.note
    skip = "SKIP fla S=300 B=2: fla: does not provide decode_step (this adapter wraps parallel_nsa, which attends"
    assert skip in (tmp_path / "decode_bench.txt").read_text()
    summary = (tmp_path / "decode_summary.txt").read_text()
    assert skip in summary and "gooddec S=   300 B=  2: attn" in summary
    assert (tmp_path / "decode.png").stat().st_size > 0


@pytest.mark.parametrize("name, what", [
    ("windec", "step output vs float64 prefill reference at t (same selection)"),
    ("blockdec", "selection vs float64 reference"),
])
def test_a_planted_bug_fails_naming_the_point(fakes, tmp_path, name, what):
    res = DecodeBench().run(_ctx(tmp_path, impl=name))
    assert res.status == Status.FAIL, res.reason
    assert f"{name} S=300 B=2" in res.reason and what in res.reason, res.reason
    r = pd.read_csv(tmp_path / "decode.csv").iloc[0]
    assert r.impl == name and r.status == "FAIL"
    if name == "windec":  # every step sees one token too many in its window (t >= w)
        assert r.parity_rel_err > r.parity_tol and "t=292" in res.reason
    else:  # the counters still equal the formula (whole blocks): only the selection check sees it
        assert r.sel_agree < 1.0 and "reads_" not in res.reason
    assert f"FAIL {name} S=300 B=2" in (tmp_path / "decode_bench.txt").read_text()


def test_only_implementations_without_a_decode_step_is_a_skip(fakes, tmp_path):
    res = DecodeBench().run(_ctx(tmp_path, impl="fla,selonlydec"))
    assert res.status == Status.SKIP
    assert "fla: does not provide decode_step" in res.reason
    assert "selonlydec: does not provide decode_step" in res.reason
    assert pd.read_csv(tmp_path / "decode.csv").empty  # nothing measured
    assert "SKIP selonlydec S=300 B=2: selonlydec: does not provide decode_step" in (
        tmp_path / "decode_bench.txt").read_text()


def test_a_step_of_the_wrong_shape_or_one_that_raises_is_an_error_row(fakes, tmp_path):
    res = DecodeBench().run(_ctx(tmp_path, impl="shortdec,raisedec"))
    assert res.status == Status.FAIL
    assert pd.read_csv(tmp_path / "decode.csv").empty
    text = (tmp_path / "decode_bench.txt").read_text()
    assert ("ERROR shortdec S=300 B=2: shortdec: decode_step raised ValueError: step returned o of shape "
            "(2, 1, 4, 1), expected [2, 1, 4, 16]") in text
    assert "ERROR raisedec S=300 B=2: raisedec: decode_step raised RuntimeError: no kernel for this GPU" in text
    assert "shortdec S=300 B=2: shortdec: decode_step raised ValueError" in res.reason


def test_a_constraint_excludes_a_point_by_name(fakes, tmp_path):
    res = DecodeBench().run(_ctx(tmp_path, impl="gooddec", dtype="bf16"))
    assert res.status == Status.SKIP and "gooddec: dtype bf16 not supported (supports fp32, fp16)" in res.reason


def test_nsa_cores_decode_step_part_passes_the_same_checks():
    """The built-in's decode_step (the static decoder's attention part over an NSACache) through the
    path an adapter takes: prefill parity at each step, the reference's selection, counters = formula."""
    from nsa_runner.impls.nsa_core import make

    o = DecodeBench().resolve(_ctx(None))
    for fill in ("prefill", "random"):
        row, problems = decode_bench.measure_impl(300, 2, {**o, "fill": fill}, "cpu", lambda _m: None, make())
        assert problems == [] and row["status"] == "PASS", problems
        assert row["sel_agree"] == 1.0 and row["parity_rel_err"] <= row["parity_tol"] and row["fill"] == fill


def test_cli_stage_runs_implementations_side_by_side_in_the_report(fakes, cli, tmp_path):
    """`nsa-run stage decode-bench --impl ...` through the CLI: the option is checked against the
    registered names, the rows land in decode.csv per implementation, report.html shows them."""
    r = cli("stage", "decode-bench", "--impl", "nope", "--out", tmp_path, "--device", "cpu")
    assert r.exit_code == 2 and "unknown implementation 'nope'" in r.output
    r = cli("stage", "decode-bench", "--impl", "nsa_core,gooddec,fla", "--kernel", "torch", "--S-list", "300",
            "--batch-list", "1", "--iters", "1", "--warmup", "0", "--profile-passes", "1", "--out", tmp_path,
            "--device", "cpu")
    assert r.exit_code == 0, r.output
    run = tmp_path / "testrun"
    df = pd.read_csv(run / "decode.csv")
    assert list(df.impl) == ["nsa_core", "gooddec"] and list(df.status) == ["PASS", "PASS"]
    assert list(df.kernel) == ["torch", "decode_step"]
    assert cli("report", run).exit_code == 0
    html = (run / "report.html").read_text()
    assert "decode.csv cannot be used" not in html and "decode_step" in html  # the rows side by side
    assert "fla: does not provide decode_step" in html  # the stage's reason names the skip
