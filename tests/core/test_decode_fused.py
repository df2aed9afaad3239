"""The fused decode step (issue 14): the attention part of a step in two Triton launches
(``StaticDecoder(impl="fused")``: append + split-K compressed pass + probabilities + top-n;
selected + window tiles + merge + gates), the key dim split into power-of-two parts (dk = 192 is
128 + 64, no padding). In the interpreter on CPU (fp32 and fp16, tiny shapes): decode == prefill
and == the reference decode step (float64), read counters == formula, selection == the Triton
6-launch step's; the per-row counters are back to 0 after every step (graph replays)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton", reason="triton not installed")

from nsa_core import NSAAttention, NSAConfig  # noqa: E402
from nsa_core.decode import reference as _decode  # noqa: E402
from nsa_core.decode.cache import formula_reads  # noqa: E402
from nsa_core.decode.kernels import split_dk  # noqa: E402
from nsa_core.testing import compare  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
CFG = dict(l=8, d=4, l_sel=16, n_sel=4, w=16)


def _pair(dk=8, dv=6, phi="avg", seed=5, dim=32, hq=4, g=2):
    torch.manual_seed(seed)
    m64 = NSAAttention(dim, hq, g, dk, dv, NSAConfig(**CFG, phi=phi)).double()
    m = NSAAttention(dim, hq, g, dk, dv, NSAConfig(**CFG, phi=phi))
    m.load_state_dict(m64.state_dict())
    return m64, m


def test_split_dk():
    assert split_dk(192) == (128, 64) and split_dk(128) == (128, 0) and split_dk(8) == (16, 0)
    assert split_dk(24) == (16, 16) and split_dk(96) == (64, 32) and split_dk(320) == (256, 64)


@pytest.mark.parametrize("phi", ["avg", "mlp"])
@pytest.mark.parametrize("dk", [8, 24])  # 24: the two-part key dim (16 + 8 padded to 16)
def test_fused_step_matches_prefill(phi, dk):
    m64, m = _pair(dk=dk, phi=phi)
    x = torch.randn(2, 84, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    y_full, _ = m64(x)
    m = m.float().to(DEV)
    for T in (7, 30, 75):  # before the first compressed token, a block boundary ahead, past n blocks
        y, cache = m(x[:, :T].float().to(DEV), max_len=96)
        dec = m.decoder(cache, impl="fused", chunk=16)  # 2 chunks: the last-arriver merge is exercised
        assert dec._tri.NCH == 2
        outs = [y] + [dec.step(x[:, k:k + 1].float().to(DEV)).clone() for k in range(T, T + 4)]
        r = compare(torch.cat(outs, 1), y_full[:, :T + 4], torch.float32)
        assert r.ok, f"fused {phi} dk={dk} T={T}: {r}"
        for key, v in formula_reads(T + 4, m.cfg).items():
            assert (cache.reads[key] == v).all(), key
        assert int(dec._tri.count.abs().sum()) == 0  # counters reset for the next step / replay


def test_fused_step_over_a_paged_cache():
    m64, m = _pair(seed=7)
    x = torch.randn(2, 60, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    y_full, _ = m64(x)
    m = m.float().to(DEV)
    y, cache = m(x[:, :41].float().to(DEV), max_len=64, page_size=4)
    dec = m.decoder(cache, impl="fused", chunk=8)
    outs = [y] + [dec.step(x[:, k:k + 1].float().to(DEV)).clone() for k in range(41, 47)]
    r = compare(torch.cat(outs, 1), y_full[:, :47], torch.float32)
    assert r.ok, f"fused paged: {r}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_step_vs_reference_decode_and_the_six_launch_step(dtype):
    """One step at a random-filled context: the fused step's output == the float64 reference decode
    fed the fused step's selection (dtype tolerance), and its selection == the 6-launch Triton step's."""
    m64, m = _pair(dk=24, dv=16, hq=8, g=2, dim=48, seed=11)
    m = m.to(dtype=dtype, device=DEV)
    S = 90
    gen = torch.Generator(device=DEV).manual_seed(0)
    cache = m.new_cache(2, 128, dtype=dtype)
    cache.fill_random_(S - 1, generator=gen)
    other = cache.clone()
    x = torch.randn(2, 1, 48, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    ref = cache.to(torch.float64, device="cpu")  # the float64 reference (m64) runs on the CPU: on the H100
    # this was a CUDA cache fed CPU keys (device mismatch, GPU-only failure)
    dec = m.decoder(cache, impl="fused", chunk=8)
    y = dec.step(x.to(dtype=dtype, device=DEV)).clone()
    six = m.decoder(other, impl="triton", chunk=8)
    six.step(x.to(dtype=dtype, device=DEV))
    assert torch.equal(torch.sort(dec.blk, -1).values, torch.sort(six.blk, -1).values)
    p = m64.project(x, S - 1)
    ref.append_(p.k_cmp[:, 0], p.v_cmp[:, 0], p.k_sel[:, 0], p.v_sel[:, 0], p.k_win[:, 0], p.v_win[:, 0])
    blk = dec.blk.cpu()
    big = torch.iinfo(torch.int64).max
    srt = torch.sort(torch.where(blk >= 0, blk, big), -1).values
    idx = torch.where(srt == big, -1, srt).to(torch.int32)[:, None]
    cnt = (blk >= 0).sum(-1).to(torch.int32)[:, None]
    o, _, _ = _decode.attend(p.q, p.gates, ref, S - 1, m64.cfg, block_idx=idx, block_count=cnt)
    r = compare(y, m64.out(o), dtype)
    assert r.ok, f"fused {dtype} vs float64 reference: {r}"
    for key, v in formula_reads(S, m.cfg).items():
        assert (cache.reads[key] == v).all(), key


def test_fused_attn_part_is_two_launches(monkeypatch):
    """The attention part launches exactly the two fused kernels (phi avg)."""
    from nsa_core.decode import kernels

    _, m = _pair()
    m = m.float().to(DEV)
    _, cache = m(torch.randn(2, 20, 32).to(DEV), max_len=32)
    dec = m.decoder(cache, impl="fused")
    launched = []
    for name in [n for n in vars(kernels) if n.endswith("_kernel")]:
        k = getattr(kernels, name)

        class Spy:
            def __init__(self, k, name):
                self.k, self.name = k, name

            def __getitem__(self, grid):
                launched.append(self.name)
                return self.k[grid]

        monkeypatch.setattr(kernels, name, Spy(k, name))
    proj = dec.project(dec.x)
    dec.pos.fill_(20)
    dec.attn(*proj)
    assert launched == ["_fused_cmp_kernel", "_fused_tiles_kernel"]
