"""Decode consistency (DESIGN §4): prefill of T tokens + k decode steps == prefill of T + k tokens.

Float64, a tiny geometry (l=8, d=4, l_sel=16, n=4, w=16) so every boundary is a few tokens
away: T = l-1, l, l_sel-1, l_sel (= w), w+1, multiples of d, and past n*l_sel (more candidate
blocks than n). B = 2, phi avg and mlp. The eager path (module forward), the static torch
decoder and the Triton decoder (interpreter on CPU) are each compared with the prefill.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # the Triton decoder runs in the interpreter on CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

from nsa_core import NSAAttention, NSAConfig  # noqa: E402
from nsa_core.decode.cache import NSACache  # noqa: E402
from nsa_core.testing import compare  # noqa: E402

CFG = dict(l=8, d=4, l_sel=16, n_sel=4, w=16)
DIM, HQ, G, DK, DV = 32, 4, 2, 8, 6
BOUNDARIES = [1, 4, 7, 8, 12, 15, 16, 17, 20, 33, 63, 64, 65]
STEPS = 6
TOTAL = 72


def _model(phi: str, seed: int = 0) -> NSAAttention:
    torch.manual_seed(seed)
    return NSAAttention(DIM, HQ, G, DK, DV, NSAConfig(**CFG, phi=phi)).double()


@pytest.fixture(scope="module", params=["avg", "mlp"])
def setup(request):
    m = _model(request.param)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, TOTAL, DIM, dtype=torch.float64, generator=g)
    y_full, _ = m(x)
    return m, x, y_full


def _check(y, ref, dtype=torch.float64, what=""):
    r = compare(y, ref, dtype)
    assert r.ok, f"{what}: {r}"


@pytest.mark.parametrize("T", BOUNDARIES)
def test_eager_decode_matches_prefill(setup, T):
    m, x, y_full = setup
    y, cache = m(x[:, :T])
    assert isinstance(cache, NSACache) and cache.length == T and cache.reads is None
    outs = [y]
    for k in range(T, T + STEPS):
        y1, cache = m(x[:, k:k + 1], cache)
        assert y1.shape == (2, 1, DIM)
        outs.append(y1)
        assert set(cache.reads) == {"cmp", "sel", "win"}
        for v in cache.reads.values():
            assert v.dtype == torch.long and v.shape == (2, G)
    assert cache.length == T + STEPS
    _check(torch.cat(outs, 1), y_full[:, :T + STEPS], what=f"T={T}")


def test_multi_token_decode_call(setup):
    """One call with several new tokens == the same tokens one by one == prefill."""
    m, x, y_full = setup
    y, cache = m(x[:, :15])
    y2, cache = m(x[:, 15:20], cache)
    assert y2.shape == (2, 5, DIM) and cache.length == 20 and len(cache.reads_per_step) == 5
    _check(torch.cat([y, y2], 1), y_full[:, :20], what="multi-token")


def test_cache_grows_past_capacity(setup):
    """Prefill with max_len = T: decode past it grows the buffers (doubling), results unchanged."""
    m, x, y_full = setup
    y, cache = m(x[:, :16], max_len=16)
    assert cache.capacity == 16
    outs = [y]
    for k in range(16, 40):
        y1, cache = m(x[:, k:k + 1], cache)
        outs.append(y1)
    assert cache.grown >= 1 and cache.capacity >= 40
    _check(torch.cat(outs, 1), y_full[:, :40], what="grown cache")


@pytest.mark.parametrize("T", [1, 7, 8, 16, 17, 31, 63])
def test_static_torch_decoder_matches_prefill(setup, T):
    """The graph-capturable static step (masks over the capacity, positions in a tensor)."""
    m, x, y_full = setup
    y, cache = m(x[:, :T], max_len=TOTAL)
    dec = m.decoder(cache, impl="torch")
    outs = [y]
    for k in range(T, min(TOTAL, T + 2 * CFG["l_sel"] + 3)):
        outs.append(dec.step(x[:, k:k + 1]).clone())
    n = len(outs) - 1
    assert cache.length == T + n
    _check(torch.cat(outs, 1), y_full[:, :T + n], what=f"static T={T}")


def test_static_decoder_from_empty_cache(setup):
    """Decoding every token from position 0 through the static step == prefill."""
    m, x, y_full = setup
    cache = m.new_cache(2, 40, dtype=torch.float64)
    dec = m.decoder(cache)
    ys = torch.cat([dec.step(x[:, k:k + 1]).clone() for k in range(40)], 1)
    _check(ys, y_full[:, :40], what="from empty")


def test_warmup_at_next_position_leaves_cache_intact(setup):
    """StaticDecoder.capture() runs the step (warm-up, capture) at position cache.length with
    whatever is in the input buffer; the next real step must still reproduce prefill."""
    m, x, y_full = setup
    for T in (15, 16, 31):  # 15 and 31: a compressed block completes at the next position (l=8, d=4)
        y, cache = m(x[:, :T], max_len=TOTAL)
        dec = m.decoder(cache)
        dec.x.normal_()
        dec._prepare_capture()
        dec.run_step()  # what capture() does on CUDA: warm-up + capture run the step
        dec.run_step()
        outs = [y] + [dec.step(x[:, k:k + 1]).clone() for k in range(T, T + 6)]
        _check(torch.cat(outs, 1), y_full[:, :T + 6], what=f"after warm-up T={T}")


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_static_branches_alone_match_eager(impl):
    """Each branch alone equals the eager reference branch (times its gate): what decode-bench times in isolation."""
    from nsa_core.decode import reference as _decode

    if impl == "triton":
        pytest.importorskip("triton", reason="triton not installed")
    dt = torch.float64 if impl == "torch" else torch.float32
    dev = "cuda" if impl == "triton" and torch.cuda.is_available() else "cpu"
    m = _model("avg", seed=3)
    x = torch.randn(2, 50, DIM, dtype=torch.float64)
    _, ref_cache = m(x[:, :49], max_len=64)
    m_run = _model("avg", seed=3).to(dtype=dt, device=dev)
    _, cache = m_run(x[:, :49].to(dtype=dt, device=dev), max_len=64)
    dec = m_run.decoder(cache, impl=impl)
    dec.pos.fill_(49)
    proj = dec.project(x[:, 49:50].to(dtype=dt, device=dev))
    dec.append(*proj[1:7])
    q, gates = proj[0], proj[7]
    p = m.project(x[:, 49:50], 49)
    ref_cache.append_(p.k_cmp[:, 0], p.v_cmp[:, 0], p.k_sel[:, 0], p.v_sel[:, 0], p.k_win[:, 0], p.v_win[:, 0])
    for i, name in enumerate(("cmp", "slc", "win")):
        onehot = torch.zeros_like(p.gates)
        onehot[..., i] = 1.0
        ref, _, _ = _decode.attend(p.q, onehot, ref_cache, 49, m.cfg)
        flags = {"cmp": False, "slc": False, "win": False, name: True}
        o = dec.branches(q, gates, **flags)  # real gates: compare gate-scaled
        ref_scaled = (ref * p.gates[..., i:i + 1]).reshape(o.shape)
        _check(o, ref_scaled, dt, what=f"{impl} branch {name} alone")


def test_decode_input_errors(setup):
    m, x, _ = setup
    _, cache = m(x[:, :10])
    with pytest.raises(ValueError, match="NSACache"):
        m(x[:, 10:11], cache={"not": "a cache"})
    with pytest.raises(ValueError, match="B=2"):
        m(x[:1, 10:11], cache)
    with pytest.raises(ValueError, match="at least one"):
        m(x[:, 10:10], cache)
    other = NSAAttention(DIM, HQ, G, DK, DV, NSAConfig(l=8, d=4, l_sel=16, n_sel=5, w=16)).double()
    with pytest.raises(ValueError, match="cache was built for"):
        other(x[:, 10:11], cache)
    with pytest.raises(ValueError, match="max_len"):
        m(x[:, :10], max_len=5)
    dec = m.decoder(m(x[:, :15], max_len=16)[1])
    dec.step(x[:, 15:16])
    with pytest.raises(ValueError, match="cache is full"):
        dec.step(x[:, 16:17])
    with pytest.raises(ValueError, match="impl"):
        m.decoder(cache, impl="cuda-magic")


def test_triton_decoder_matches_prefill():
    """Fused Triton step (interpreter on CPU, fp32) over several boundaries, both phi, split-K chunks."""
    pytest.importorskip("triton", reason="triton not installed")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for phi in ("avg", "mlp"):
        m64 = _model(phi, seed=5)
        x = torch.randn(2, 84, DIM, dtype=torch.float64)
        y_full, _ = m64(x)
        m = _model(phi, seed=5).float().to(dev)
        for T in (7, 75):
            y, cache = m(x[:, :T].float().to(dev), max_len=96)
            dec = m.decoder(cache, impl="triton", chunk=16)  # 2 chunks: at T=75 both hold visible tokens
            assert dec._tri.NCH == 2
            outs = [y]
            for k in range(T, T + 4):
                outs.append(dec.step(x[:, k:k + 1].float().to(dev)).clone())
            _check(torch.cat(outs, 1), y_full[:, :T + 4], torch.float32, what=f"triton {phi} T={T}")


@pytest.mark.parametrize("selection,tiles", [("logits", "separate"), ("blocks", "separate"),
                                             ("blocks-row", "separate"), ("blocks", "merged")])
def test_triton_fused_steps_equal_the_six_launch_step(selection, tiles):
    """The step with the append inside the compressed pass (tune fuse_append, the default) writes the same
    caches, picks the same blocks and returns the same output as the 6-launch step, bit for bit, whichever
    way it selects: from logits (5 launches), from per-tile block partials with the scores in parallel (5)
    or in one program per row (4), and with the tiles and the merge in one launch (tiles="merged": one
    fewer); over steps where compressed tokens complete in a chunk other than chunk
    0 (written by that chunk, not by the appending one); fp32 and fp16; no PDL in the interpreter. The
    six-launch step issues its loads late (tune early_loads=False), so the early loads of the block scores,
    top-n, tiles and combine (the default) are checked against the late order too."""
    pytest.importorskip("triton", reason="triton not installed")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 90, DIM, dtype=torch.float64, generator=g)
    for dtype in (torch.float32, torch.float16):
        m = _model("avg", seed=7).to(device=dev, dtype=dtype)
        decs, caches = {}, {}
        six = {"fuse_append": False, "early_loads": False}
        fused = {"selection": selection, "tiles": tiles, "early_loads": True}
        for name, tune in (("fused", fused), ("six", six)):
            _, caches[name] = m(x[:, :70].to(device=dev, dtype=dtype), max_len=96)
            # compressed rows in 8-row chunks: the completing token lands in chunk >= 1
            # merged tiles merge in the tile kernel's warps (4): the six-launch combine in as many, so that
            # both reduce in the same order (the one-wave warps would change it)
            warps = {"combine": 4, "selwin": 4} if tiles == "merged" and name == "six" else None
            decs[name] = m.decoder(caches[name], impl="triton", chunk=8, tune=tune, warps=warps)
        assert decs["fused"]._tri.NCH >= 2 and not decs["six"]._tri.tune["fuse_append"]
        assert decs["fused"]._tri.early(10 ** 9) and not decs["six"]._tri.early(1)
        assert (decs["fused"]._tri._blocks() is None) == (selection == "logits")
        emitted = 0
        for k in range(70, 78):
            emitted += int((k + 1 - CFG["l"]) % CFG["d"] == 0)
            ys = {n: d.step(x[:, k:k + 1].to(device=dev, dtype=dtype)).clone() for n, d in decs.items()}
            assert torch.isfinite(ys["six"]).all() and ys["six"].abs().sum() > 0
            assert torch.equal(decs["fused"].blk, decs["six"].blk), f"{dtype} step {k}: the selection differs"
            assert torch.equal(ys["fused"], ys["six"]), f"{dtype} step {k}: the output differs"
        assert emitted >= 2  # compressed tokens completed inside the steps compared
        for name in ("K_sel", "V_sel", "K_win", "V_win", "K_raw", "V_raw", "K_cmp", "V_cmp"):
            assert torch.equal(getattr(caches["fused"], name), getattr(caches["six"], name)), f"{dtype}: {name}"
    with pytest.raises(ValueError, match="unknown tune keys"):
        m.decoder(caches["six"], impl="triton", tune={"pdll": True})
    with pytest.raises(ValueError, match="selection must be one of"):
        m.decoder(caches["six"], impl="triton", tune={"selection": "magic"})
    with pytest.raises(ValueError, match="tiles must be one of"):
        m.decoder(caches["six"], impl="triton", tune={"tiles": "magic"})
    with pytest.raises(ValueError, match="early_loads must be None, True or False"):
        m.decoder(caches["six"], impl="triton", tune={"early_loads": "yes"})


def test_triton_step_policy_by_grid():
    """Early loads and the one-wave warps apply where a kernel's grid fits in one wave of the device's SMs,
    unless the tune / warps given say otherwise; top-n runs in one warp over at most 128 blocks."""
    pytest.importorskip("triton", reason="triton not installed")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m = _model("avg", seed=3).float().to(dev)
    _, cache = m(torch.randn(1, 20, DIM).to(dev), max_len=96)
    w = m.decoder(cache, impl="triton")._tri
    assert w.early(w.SMS) and not w.early(w.SMS + 1)
    assert w.warps("combine", w.SMS) == w.WAVE_WARPS["combine"] and w.warps("combine", w.SMS + 1) == w.CONFIG["combine"]
    assert w.topn_warps() == 1  # NB = 96 / l_sel blocks
    assert w.row_select() == (w.dec.NB <= w._blocks()["BJ"])  # scores + top-n in one launch where one slice
    assert not m.decoder(cache, impl="triton", tune={"selection": "blocks"})._tri.row_select()
    w = m.decoder(cache, impl="triton", tune={"early_loads": False}, warps={"combine": 2, "select": 4})._tri
    assert not w.early(1) and w.warps("combine", 1) == 2 and w.topn_warps() == 4
    assert m.decoder(cache, impl="triton", tune={"early_loads": True})._tri.early(10 ** 9)


def test_triton_full_decode_baseline():
    """The flash-decoding full-attention baseline of decode-bench: all s = pos + 1 keys, split-K merged."""
    pytest.importorskip("triton", reason="triton not installed")
    from nsa_runner.measure.decode_baselines import FullDecode

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(4)
    B, G, h, dk, dv, cap, pos = 2, 2, 3, 8, 6, 96, 70
    q = torch.randn(B, G * h, dk, generator=g).to(dev)
    K = torch.randn(B, G, cap, dk, generator=g).to(dev)
    V = torch.randn(B, G, cap, dv, generator=g).to(dev)
    fd = FullDecode(q, K, V, torch.tensor(pos, device=dev), dk ** -0.5, chunk=16)
    assert fd.NCH == 6
    o = fd()
    q4 = q.double().view(B, G, h, dk)
    ref = torch.softmax(q4 @ K[:, :, :pos + 1].double().transpose(-1, -2) * dk ** -0.5, -1) @ V[:, :, :pos + 1].double()
    _check(o, ref, torch.float32, what="full decode")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_step_matches_reference(impl, dtype):
    """CUDA: a graph-captured step, replayed over positions, vs the float64 eager reference fed
    the step's own selection (bf16 scores may rank near-ties differently)."""
    from nsa_core.decode import reference as _decode

    if impl == "triton":
        pytest.importorskip("triton")
    torch.manual_seed(0)
    cfg = NSAConfig()  # paper geometry
    m64 = NSAAttention(256, 32, 2, 64, 32, cfg).double().cuda()
    m = NSAAttention(256, 32, 2, 64, 32, cfg).cuda()
    m.load_state_dict(m64.state_dict())
    m = m.to(dtype)
    B, S = 2, 3000
    x = torch.randn(B, S + 8, 256, device="cuda", dtype=torch.float64)
    cache = m.new_cache(B, S + 64, dtype=dtype)
    cache.fill_random_(S, generator=torch.Generator("cuda").manual_seed(0), scale=1.0)
    ref = cache.to(torch.float64)
    dec = m.decoder(cache, impl=impl)
    dec.capture()
    for k in range(S, S + 8):
        y = dec.step(x[:, k:k + 1].to(dtype)).clone()
        p = m64.project(x[:, k:k + 1], k)
        ref.append_(p.k_cmp[:, 0], p.v_cmp[:, 0], p.k_sel[:, 0], p.v_sel[:, 0], p.k_win[:, 0], p.v_win[:, 0])
        sel = cache.last_selection[:, None]  # [B, 1, G, n]
        cnt = (sel >= 0).sum(-1).to(torch.int32)
        sel_sorted = torch.sort(torch.where(sel >= 0, sel, torch.iinfo(torch.int64).max), -1).values
        sel_sorted = torch.where(sel_sorted == torch.iinfo(torch.int64).max, -1, sel_sorted).to(torch.int32)
        o, _, _ = _decode.attend(p.q, p.gates, ref, k, cfg, block_idx=sel_sorted, block_count=cnt)
        r = compare(y, m64.out(o), dtype)
        assert r.ok, f"{impl} {dtype} t={k}: {r}"
