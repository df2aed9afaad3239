"""nsa_core.flash on CPU: the packing / tiling index math (through SDPA's math backend, the
``sdpa-math`` twin of the GPU paths) against the float64 reference, forward and backward; clear
errors where no flash kernel exists. The GPU paths themselves are checked by the fa2-probe stage."""

from __future__ import annotations

import math

import pytest
import torch

from nsa_core import NSAConfig
from nsa_core import functional as F
from nsa_core.compression import fast as cmp_fast
from nsa_core.compression import reference as cmp_ref
from nsa_core.flash import adapters as K
from nsa_core.flash import pick
from nsa_core.testing import case_id, compare
from nsa_core.window import fast as win_fast
from nsa_core.window import reference as win_ref

F64 = torch.float64

# (B, S, Tq, HQ, G, D, l, d, w): T < l, T < w, T % d != 0, h in {1, 4, 16}, B > 1, Tq < S, decode
CASES = [
    (1, 20, 20, 4, 1, 8, 32, 16, 64),
    (2, 100, 100, 4, 2, 16, 32, 16, 40),
    (2, 77, 5, 4, 4, 8, 32, 16, 20),
    (1, 200, 1, 8, 2, 8, 32, 16, 64),
    (2, 95, 60, 4, 1, 8, 16, 8, 7),
    (1, 64, 33, 2, 2, 8, 32, 16, 16),
    (1, 47, 47, 16, 1, 8, 32, 16, 1),
    (2, 131, 131, 16, 4, 8, 16, 16, 512),
    (1, 90, 90, 4, 2, 8, 32, 8, 30),
]


def _cid(c):
    B, S, Tq, HQ, G, D, l, d, w = c
    return case_id(B, S, HQ, G, D, D, F64, q=Tq, l=l, d=d, w=w)


def _inputs(c, seed):
    B, S, Tq, HQ, G, D, l, d, w = c
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=F64)  # noqa: E731
    return mk(B, Tq, HQ, D), mk(B, S, G, D), mk(B, S, G, D), mk(B, Tq, HQ, D)


def _fwd_bwd(fn, leaves, do):
    leaves = [x.detach().clone().requires_grad_(True) for x in leaves]
    o = fn(*leaves)
    if not o.requires_grad:  # nothing visible: constant zeros
        return o, [torch.zeros_like(x) for x in leaves]
    gs = torch.autograd.grad(o, leaves, do, allow_unused=True)
    return o.detach(), [torch.zeros_like(x) if gr is None else gr for x, gr in zip(leaves, gs, strict=True)]


def _assert_all_ok(outs, refs):
    for name, o, r in zip(("o", "dq", "dk", "dv"), outs, refs, strict=True):
        c = compare(o, r, F64)
        assert c.ok, f"{name}: {c}"


@pytest.mark.parametrize("c", [pytest.param(c, id=_cid(c)) for c in CASES])
def test_compressed_packing_matches_reference(c):
    B, S, Tq, HQ, G, D, l, d, w = c
    cfg = NSAConfig(l=l, d=d, l_sel=max(64, l), w=w)
    q, k, v, do = _inputs(c, 1)
    kc, vc = cmp_ref.compress_avg(k, cfg), cmp_ref.compress_avg(v, cfg)
    ref, rg = _fwd_bwd(lambda a, b, e: cmp_ref.compressed_attention(a, b, e, S, cfg), [q, kc, vc], do)
    out, og = _fwd_bwd(lambda a, b, e: cmp_fast.compressed_attention(a, b, e, S, cfg, path="sdpa-math"),
                       [q, kc, vc], do)
    assert out.shape == (B, Tq, HQ, D)
    assert torch.isfinite(out).all()
    _assert_all_ok([out, *og], [ref, *rg])
    if S >= l:  # a non-trivial case: the outputs are not all zero
        assert out.abs().max() > 0.01
    else:  # nothing visible: exactly 0, still on autograd (as the reference), gradients 0
        assert torch.equal(out, torch.zeros_like(out))
        qq = q.detach().requires_grad_(True)
        o = cmp_fast.compressed_attention(qq, kc, vc, S, cfg, path="sdpa-math")
        assert o.requires_grad
        o.sum().backward()
        assert torch.equal(qq.grad, torch.zeros_like(qq))


@pytest.mark.parametrize("tile", [None, 8, 3])
@pytest.mark.parametrize("c", [pytest.param(c, id=_cid(c)) for c in CASES])
def test_window_tiles_match_reference(c, tile):
    B, S, Tq, HQ, G, D, l, d, w = c
    q, k, v, do = _inputs(c, 2)
    ref, rg = _fwd_bwd(lambda a, b, e: win_ref.sliding_attention(a, b, e, w), [q, k, v], do)
    out, og = _fwd_bwd(lambda a, b, e: K.window(a, b, e, w, 1 / math.sqrt(D), "sdpa-math", tile), [q, k, v], do)
    _assert_all_ok([out, *og], [ref, *rg])


def test_public_sliding_entry_point_on_the_math_twin():
    c = CASES[1]
    q, k, v, _ = _inputs(c, 3)
    out = win_fast.sliding_attention(q, k, v, c[-1], path="sdpa-math", scale=0.3)
    ref = win_ref.sliding_attention(q, k, v, c[-1], scale=0.3)
    assert compare(out, ref, F64).ok


def test_a_wrong_geometry_is_caught():
    """The comparison can fail: packing with the wrong l (or w) is far over tolerance."""
    c = CASES[1]
    q, k, v, _ = _inputs(c, 4)
    cfg, wrong = NSAConfig(l=32, d=16), NSAConfig(l=16, d=16)
    kc, vc = cmp_ref.compress_avg(k, cfg), cmp_ref.compress_avg(v, cfg)
    ref = cmp_ref.compressed_attention(q, kc, vc, 100, cfg)
    assert not compare(cmp_fast.compressed_attention(q, kc, vc, 100, wrong, path="sdpa-math"), ref, F64).ok
    ref = win_ref.sliding_attention(q, k, v, 40)
    assert not compare(win_fast.sliding_attention(q, k, v, 39, path="sdpa-math"), ref, F64).ok


def test_folding_is_a_view_and_maps_each_head_to_its_group():
    B, Tc, d, G, h, D = 2, 5, 4, 3, 2, 1
    x = torch.arange(B * (Tc * d + 3) * G * h, dtype=F64).reshape(B, Tc * d + 3, G * h, D)
    f = cmp_fast._chunks(x, 3, Tc, d)
    assert f.shape == (B, Tc, d * G * h, D) and f.data_ptr() == x[:, 3:].data_ptr()  # a view: no copy
    # folded head j*HQ + hq of chunk i is query row 3 + i*d + j, head hq
    assert f[1, 2, 3 * G * h + 1 * h + 1, 0] == x[1, 3 + 2 * d + 3, 1 * h + 1, 0]
    kv = torch.arange(B * Tc * G * D, dtype=F64).reshape(B, Tc, G, D)
    kx = cmp_fast._expand_groups(kv, d)
    # GQA of the folded problem: folded head f reads KV head f // h, which is group hq // h
    for j in range(d):
        for hq in range(G * h):
            assert torch.equal(kx[:, :, (j * G * h + hq) // h], kv[:, :, hq // h])


# ---- no flash kernel here: clear errors -------------------------------------------------------

def test_cpu_has_no_flash_path_and_says_why():
    st = K.available_paths("cpu")
    assert list(st) == list(pick.PATHS)
    assert all(not s["present"] and "CUDA" in s["reason"] for s in st.values())


def test_backend_flash_on_cpu_fails_clearly():
    cfg = NSAConfig()
    q, k, v = (torch.randn(1, 64, 2, 16) for _ in range(3))
    with pytest.raises(pick.FlashUnavailable, match="Use backend='sdpa'") as ei:
        F.sliding_attention(q, k, v, cfg, backend="flash")
    assert "varlen" in str(ei.value) and "CUDA" in str(ei.value)
    with pytest.raises(pick.FlashUnavailable, match="cmp"):
        F.compressed_attention(q, k, v, cfg, backend="flash")


def test_pinned_path_that_cannot_run_says_why():
    q, k, v = (torch.randn(1, 64, 2, 16) for _ in range(3))
    with pytest.raises(K.PathUnavailable, match="CUDA"):
        win_fast.sliding_attention(q, k, v, 16, path="varlen")
    with pytest.raises(K.PathUnavailable, match="cannot express the win branch"):
        win_fast.sliding_attention(q, k, v, 16, path="sdpa-flash")
    with pytest.raises(ValueError, match="unknown flash path"):
        win_fast.sliding_attention(q, k, v, 16, path="fa9")


@pytest.mark.parametrize("call, msg", [
    (lambda q, k, v: win_fast.sliding_attention(q, k, v, 0, path="sdpa-math"), "positive int"),
    (lambda q, k, v: win_fast.sliding_attention(q, k[:, :10], v[:, :10], 4, path="sdpa-math"), "more queries"),
    (lambda q, k, v: win_fast.sliding_attention(q, k, v[:, :, :1], 4, path="sdpa-math"), "disagree"),
    (lambda q, k, v: win_fast.sliding_attention(q[..., :8], k, v, 4, path="sdpa-math"), "head dim"),
    (lambda q, k, v: win_fast.sliding_attention(q[:, :, :3], k, v, 4, path="sdpa-math"), "multiple of KV groups"),
    (lambda q, k, v: cmp_fast.compressed_attention(q, k, v, 10, NSAConfig(), path="sdpa-math"), "must be an int >="),
    (lambda q, k, v: win_fast.sliding_attention(q.half(), k, v, 4, path="sdpa-math"), "dtype mismatch"),
])
def test_bad_input_is_a_value_error(call, msg):
    q, k, v = torch.randn(1, 32, 4, 16), torch.randn(1, 32, 2, 16), torch.randn(1, 32, 2, 16)
    with pytest.raises(ValueError, match=msg):
        call(q, k, v)


def test_fewer_compressed_tokens_than_exist_at_S():
    """kc may hold fewer tokens than num_cmp(S): later queries then see all of them (as the reference)."""
    cfg = NSAConfig(l=32, d=16)
    c = (2, 130, 130, 4, 2, 8, 32, 16, 64)
    q, k, v, do = _inputs(c, 5)
    kc, vc = cmp_ref.compress_avg(k, cfg)[:, :3], cmp_ref.compress_avg(v, cfg)[:, :3]  # 7 exist at S=130
    ref, rg = _fwd_bwd(lambda a, b, e: cmp_ref.compressed_attention(a, b, e, 130, cfg), [q, kc, vc], do)
    out, og = _fwd_bwd(lambda a, b, e: cmp_fast.compressed_attention(a, b, e, 130, cfg, path="sdpa-math"),
                       [q, kc, vc], do)
    _assert_all_ok([out, *og], [ref, *rg])


# ---- flash-attn adapters through FAKE modules (tests/_fake_flash.py) ---------------------------
# The fakes have the real packages' signatures and compute in float64; they check the argument
# mapping and index math of the fa2 / fa4 adapters on CPU. NOT GPU evidence: adapters.GPU_VERIFIED.

from tests import _fake_flash as fake  # noqa: E402

F16 = torch.float16
# (B, S, Tq, HQ, G, D, w): GQA, Tq < S, decode, window shorter / longer than S
FAKE_CASES = [(2, 70, 70, 4, 2, 16, 24), (1, 90, 7, 8, 2, 16, 30), (2, 50, 1, 4, 1, 8, 16), (1, 40, 40, 2, 2, 8, 64)]


def _half_inputs(c, seed):
    B, S, Tq, HQ, G, D, w = c
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=F64)  # noqa: E731
    return mk(B, Tq, HQ, D), mk(B, S, G, D), mk(B, S, G, D), mk(B, Tq, HQ, D)


def _ok16(outs, refs):
    for name, o, r in zip(("o", "dq", "dk", "dv"), outs, refs, strict=True):
        c = compare(o.double(), r, F16)
        assert c.ok, f"{name}: {c}"


@pytest.mark.parametrize("path", ["fa2", "fa4"])
@pytest.mark.parametrize("c", FAKE_CASES, ids=lambda c: "B{}-S{}-q{}-HQ{}-G{}-d{}-w{}".format(*c))
def test_flash_attn_adapters_through_fake_modules(monkeypatch, path, c):
    """window / causal / full of the fa2 and fa4 adapters (real signatures, FAKE kernels) vs the
    float64 references, forward and backward, fp16 inputs."""
    fake.install(monkeypatch)
    B, S, Tq, HQ, G, D, w = c
    q, k, v, do = _half_inputs(c, 11)
    scale = 0.7 / math.sqrt(D)
    half = [x.half() for x in (q, k, v)]
    ref, rg = _fwd_bwd(lambda a, b, e: win_ref.sliding_attention(a, b, e, w, scale=scale), [q, k, v], do)
    out, og = _fwd_bwd(lambda a, b, e: K.window(a, b, e, w, scale, path), half, do.half())
    assert out.dtype == F16 and out.shape == (B, Tq, HQ, D)
    _ok16([out, *og], [ref, *rg])
    full = lambda a, b, e: win_ref.sliding_attention(a, b, e, S, scale=scale)  # noqa: E731 - w >= S: causal
    ref, rg = _fwd_bwd(full, [q, k, v], do)
    out, og = _fwd_bwd(lambda a, b, e: K.causal(a, b, e, scale, path), half, do.half())
    _ok16([out, *og], [ref, *rg])


@pytest.mark.parametrize("path", ["fa2", "fa4"])
def test_branch_fast_paths_run_end_to_end_on_fake_modules(monkeypatch, path):
    """compressed (folded queries, bottom-right causal) and sliding branches with path='fa2'/'fa4'
    through pick()/check() (status faked present on CPU), vs the float64 references."""
    fake.install(monkeypatch)
    fake.present_on_cpu(monkeypatch)
    cfg = NSAConfig(l=32, d=16, w=40)
    for c in [(2, 130, 130, 4, 2, 16, 40), (1, 200, 9, 8, 2, 16, 40), (3, 96, 1, 4, 1, 16, 40)]:
        q, k, v, do = _half_inputs(c, 12)
        S = c[1]
        kc, vc = cmp_ref.compress_avg(k, cfg), cmp_ref.compress_avg(v, cfg)
        ref, rg = _fwd_bwd(lambda a, b, e, S=S: cmp_ref.compressed_attention(a, b, e, S, cfg), [q, kc, vc], do)
        out, og = _fwd_bwd(lambda a, b, e, S=S: cmp_fast.compressed_attention(a, b, e, S, cfg, path=path),
                           [x.half() for x in (q, kc, vc)], do.half())
        _ok16([out, *og], [ref, *rg])
        ref, rg = _fwd_bwd(lambda a, b, e: win_ref.sliding_attention(a, b, e, cfg.w), [q, k, v], do)
        out, og = _fwd_bwd(lambda a, b, e: win_fast.sliding_attention(a, b, e, cfg.w, path=path),
                           [x.half() for x in (q, k, v)], do.half())
        _ok16([out, *og], [ref, *rg])
    with pytest.raises(K.PathUnavailable, match="fp16/bf16 only"):  # the dtype rule of check()
        win_fast.sliding_attention(q.float(), k.float(), v.float(), cfg.w, path=path)


def test_fake_adapter_parity_can_fail(monkeypatch):
    """The comparison above is not vacuous: an adapter passing the wrong window is caught."""
    fake.install(monkeypatch)
    c = FAKE_CASES[0]
    q, k, v, _ = _half_inputs(c, 13)
    ref = win_ref.sliding_attention(q, k, v, c[-1])
    monkeypatch.setattr(K, "_fa4", lambda q_, k_, v_, s, win, return_lse=False:
                        fake.fa4_flash_attn_func(q_, k_, v_, softmax_scale=s, window_size=(win[0] + 1, 0))[0])
    monkeypatch.setitem(K._FA, "fa4", K._fa4)
    out = K.window(q.half(), k.half(), v.half(), c[-1], 1 / math.sqrt(c[5]), "fa4")
    assert not compare(out.double(), ref, F16).ok


def test_fa4_attention_lse_is_the_per_head_logsumexp(monkeypatch):
    """attention_lse (FA-4 return_lse): lse [B, Lq, H] float32 = log sum_j exp(scale q.k_j) over the
    visible keys (bottom-right causal), transposed from FA-4's [B, H, Lq]."""
    fake.install(monkeypatch)
    B, Lq, Lk, H, G, D = 2, 5, 9, 4, 2, 16
    g = torch.Generator().manual_seed(14)
    q, k, v = (torch.randn(B, n, h, D, generator=g, dtype=F64) for n, h in ((Lq, H), (Lk, G), (Lk, G)))
    scale = 0.3
    o, lse = K.attention_lse(q.half(), k.half(), v.half(), scale, "fa4", causal=True)
    s = torch.einsum("bqhd,bkhd->bhqk", q.half().double(), k.half().double().repeat_interleave(H // G, 2)) * scale
    vis = torch.arange(Lk)[None, :] <= torch.arange(Lq)[:, None] + (Lk - Lq)
    want = torch.logsumexp(s.masked_fill(~vis, float("-inf")), -1).transpose(1, 2)  # [B, Lq, H]
    assert lse.shape == (B, Lq, H) and lse.dtype == torch.float32 and not lse.requires_grad
    assert torch.allclose(lse.double(), want, atol=1e-5)
    assert compare(o.double(), win_ref.sliding_attention(q, k, v, Lk, scale=scale), F16).ok
    _, lse1 = K.attention_lse(q[:, -1:].half(), k.half(), v.half(), scale, "fa4", causal=True)  # decode row
    assert torch.allclose(lse1.double(), want[:, -1:], atol=1e-5)
    with pytest.raises(ValueError, match="returns no lse"):
        K.attention_lse(q, k, v, scale, "fa2", causal=True)


def test_adapters_pass_only_keywords_the_real_functions_take(monkeypatch):
    """The fakes take no **kwargs: a keyword the real flash_attn_func lacks is a TypeError."""
    fake.install(monkeypatch)
    q = torch.randn(1, 4, 2, 8, dtype=F16)
    with pytest.raises(TypeError):
        fake.fa4_flash_attn_func(q, q, q, window=(3, 0))
    with pytest.raises(TypeError):
        fake.fa2_flash_attn_func(q, q, q, return_lse=True)
    with pytest.raises(RuntimeError, match="fp16 and bf16"):
        fake.fa2_flash_attn_func(q.float(), q.float(), q.float())


def _real_fa4_wheel():
    import glob
    from pathlib import Path

    hits = sorted(glob.glob(str(Path(__file__).resolve().parents[2] / ".devcarry/fa4/flash_attn_4-*.whl")))
    return hits[-1] if hits else None


@pytest.mark.skipif(_real_fa4_wheel() is None, reason="no flash-attn-4 wheel in .devcarry/fa4 (bench/prepare_fa4.sh)")
def test_fake_fa4_signature_is_the_real_one():
    """The FAKE flash_attn.cute.flash_attn_func has the real 4.0 signature (read from the wheel's
    interface.py with ast, without importing it: the CuTe DSL needs a GPU)."""
    import ast
    import inspect
    import zipfile

    src = zipfile.ZipFile(_real_fa4_wheel()).read("flash_attn/cute/interface.py").decode()
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "flash_attn_func")
    a = fn.args
    real = [x.arg for x in a.args]
    defaults = [ast.literal_eval(d) if not isinstance(d, ast.Name) or d.id != "None" else None for d in a.defaults]
    fk = inspect.signature(fake.fa4_flash_attn_func).parameters
    assert list(fk) == real
    assert [p.default for p in fk.values()][len(real) - len(defaults):] == defaults


def test_fa4_head_dim_rule_per_architecture():
    P = K.fa4_head_dims_problem
    assert P(128, 128, (9, 0)) == "" and P(192, 128, (9, 0)) == "" and P(256, 256, (9, 0)) == ""
    assert "multiples of 8" in P(100, 100, (9, 0)) and "8..256" in P(264, 128, (9, 0))
    assert P(192, 128, (10, 0)) == "" and P(256, 256, (10, 0)) == "" and P(64, 64, (10, 0)) == ""
    assert "sm_10x" in P(160, 160, (10, 0)) and "sm_10x" in P(192, 192, (10, 0))
    assert P(128, 128, None) == ""


def test_fa4_absent_or_on_cpu_says_why(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "flash_attn", None)  # import flash_attn -> ImportError
    monkeypatch.delitem(sys.modules, "flash_attn.cute", raising=False)
    monkeypatch.setattr(K, "_imported", {})
    st = K.status("fa4", "cuda")
    assert not st["present"] and "flash_attn.cute not installed" in st["reason"] and "flash-attn-4" in st["reason"]
    assert "CUDA" in K.status("fa4", "cpu")["reason"]
    q = torch.randn(1, 8, 2, 16, dtype=F16)
    with pytest.raises(K.PathUnavailable, match="CUDA"):
        win_fast.sliding_attention(q, q, q, 4, path="fa4")
    assert "not GPU-verified" in K.verified_label("fa3")


def test_fa4_import_turns_on_its_persistent_jit_cache_unless_the_user_chose(monkeypatch):
    import os

    fake.install(monkeypatch)
    K._import("fa4")
    assert os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] == "1"
    assert os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] == str(K.fa4_jit_cache_dir())
    fake.install(monkeypatch)
    monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "0")
    K._import("fa4")
    assert os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] == "0"


@pytest.mark.parametrize("first", ["detect", "probe"])
def test_fa4_jit_cache_is_on_before_whichever_code_imports_it_first(tmp_path, monkeypatch, first):
    """FA-4 reads its persistent-cache settings once, at import. On the H100 (2026-11-25) the
    detection (fa2-probe's probe, routing) imported flash_attn.cute before the adapter had set
    them: every process recompiled every FA-4 kernel (fa2-probe's FA-4 parity: 139 s on a warm
    machine). Whatever imports it first, the settings are there at that import (FAKE dist)."""
    import sys

    from nsa_core.flash import detect as D
    from nsa_runner.measure import flash_probe

    fake.install_dists(monkeypatch, tmp_path / "site", which=("fa4",))
    monkeypatch.setattr(K, "_detected_cache", {}, raising=False)
    if first == "detect":
        assert D.detect("fa4")["present"]
    else:
        flash_probe._import_row("fa4", "flash_attn.cute (FA-4)", "flash_attn.cute", ("flash-attn-4",), ())
    seen = sys.modules["flash_attn.cute"].CACHE_SETTINGS_AT_IMPORT
    assert seen == {"FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1",
                    "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(K.fa4_jit_cache_dir())}
