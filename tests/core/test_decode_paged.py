"""Paged KV cache (issue 14): the raw selection cache in pages behind a block table, as vLLM /
FlashInfer hold KV. Decode through it == prefill (float64, the tiny geometry of test_decode.py),
for the eager path, the static torch step and the Triton steps (6-launch and split; interpreter on CPU), page sizes
smaller than, equal to and larger than a selection block; the layout is what the docstring says
(token t of sequence b at K_sel[block_table[b, t // P], :, t % P]); counters stay exact."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from nsa_core import NSAAttention, NSAConfig  # noqa: E402
from nsa_core.decode.cache import NSACache, formula_reads  # noqa: E402
from nsa_core.testing import compare  # noqa: E402

CFG = dict(l=8, d=4, l_sel=16, n_sel=4, w=16)
DIM, HQ, G, DK, DV = 32, 4, 2, 8, 6
TOTAL = 72


def _model(phi="avg", seed=0):
    torch.manual_seed(seed)
    return NSAAttention(DIM, HQ, G, DK, DV, NSAConfig(**CFG, phi=phi)).double()


@pytest.fixture(scope="module")
def setup():
    m = _model()
    x = torch.randn(2, TOTAL, DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return m, x, m(x)[0]


def _ok(y, ref, dtype=torch.float64, what=""):
    r = compare(y, ref, dtype)
    assert r.ok, f"{what}: {r}"


@pytest.mark.parametrize("P", [4, 16, 32])
def test_paged_layout_is_the_block_table(setup, P):
    m, x, _ = setup
    _, dense = m(x[:, :40], max_len=64)
    _, paged = m(x[:, :40], max_len=64, page_size=P)
    assert paged.paged and not dense.paged and paged.page_size == P and paged.capacity == 64
    bt = paged.block_table
    assert bt.dtype == torch.int32 and tuple(bt.shape) == (2, 64 // P)
    assert bt.unique().numel() == bt.numel() and (bt[0, 1:] - bt[0, :-1] != 1).all()  # not contiguous
    for b in range(2):
        for t in (0, 5, 16, 39):
            page = int(bt[b, t // P])
            assert torch.equal(paged.K_sel[page, :, t % P], dense.K_sel[b, :, t])
            assert torch.equal(paged.V_sel[page, :, t % P], dense.V_sel[b, :, t])
    for a, b_ in zip(paged.sel_kv(), dense.sel_kv(), strict=True):
        assert torch.equal(a, b_)


@pytest.mark.parametrize("P", [4, 16, 32])
def test_eager_decode_through_pages_matches_prefill(setup, P):
    m, x, y_full = setup
    y, cache = m(x[:, :13], page_size=P, max_len=32)  # decode past 32 grows the pool (new pages)
    outs = [y]
    for k in range(13, 50):
        y1, cache = m(x[:, k:k + 1], cache)
        outs.append(y1)
        want = formula_reads(k + 1, m.cfg)
        assert {key: set(v.flatten().tolist()) for key, v in cache.reads.items()} == \
            {key: {v} for key, v in want.items()}, f"counters at s={k + 1}"
    assert cache.grown >= 1 and cache.capacity >= 50 and cache.paged
    _ok(torch.cat(outs, 1), y_full[:, :50], what=f"eager paged P={P}")


@pytest.mark.parametrize("P", [4, 32])
def test_static_torch_step_through_pages_matches_prefill(setup, P):
    m, x, y_full = setup
    y, cache = m(x[:, :15], max_len=TOTAL, page_size=P)
    dec = m.decoder(cache, impl="torch")
    outs = [y] + [dec.step(x[:, k:k + 1]).clone() for k in range(15, 52)]
    _ok(torch.cat(outs, 1), y_full[:, :52], what=f"static paged P={P}")


def test_static_step_from_an_empty_paged_cache_with_a_callers_block_table(setup):
    m, x, y_full = setup
    g = torch.Generator().manual_seed(3)
    table = torch.randperm(2 * 12, generator=g).view(2, 12)  # a serving engine's allocator: any order
    cache = m.new_cache(2, 48, dtype=torch.float64, page_size=4, block_table=table)
    assert torch.equal(cache.block_table, table.int())
    dec = m.decoder(cache)
    ys = torch.cat([dec.step(x[:, k:k + 1]).clone() for k in range(40)], 1)
    _ok(ys, y_full[:, :40], what="paged from empty")


@pytest.mark.parametrize("impl", ["triton", "split"])  # split: the two-launch split-K step (issue 14)
@pytest.mark.parametrize("phi", ["avg", "mlp"])
def test_triton_step_through_pages_matches_prefill(phi, impl):
    pytest.importorskip("triton", reason="triton not installed")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m64 = _model(phi, seed=5)
    x = torch.randn(2, 84, DIM, dtype=torch.float64)
    y_full, _ = m64(x)
    m = _model(phi, seed=5).float().to(dev)
    y, cache = m(x[:, :75].float().to(dev), max_len=96, page_size=8)
    dec = m.decoder(cache, impl=impl, chunk=16)
    outs = [y] + [dec.step(x[:, k:k + 1].float().to(dev)).clone() for k in range(75, 80)]
    _ok(torch.cat(outs, 1), y_full[:, :80], torch.float32, what=f"{impl} paged {phi}")
    for key, v in formula_reads(80, m.cfg).items():
        assert (cache.reads[key] == v).all(), key


@pytest.mark.parametrize("table, match", [
    (torch.zeros(2, 4, dtype=torch.int32), "distinct"),
    (torch.arange(8).view(2, 4) + 1, "distinct page ids in 0..7"),
    (torch.arange(6).view(2, 3), r"\[B=2, 4\]"),
    (torch.arange(8.0).view(2, 4), "integer"),
])
def test_bad_block_tables_are_refused(table, match):
    with pytest.raises(ValueError, match=match):
        NSACache.empty(NSAConfig(**CFG), 2, G, DK, DV, 16, page_size=4, block_table=table)


def test_bad_page_size_is_refused():
    for bad in (0, -4, 2.5, True):
        with pytest.raises(ValueError, match="page_size"):
            NSACache.empty(NSAConfig(**CFG), 2, G, DK, DV, 16, page_size=bad)
    with pytest.raises(ValueError, match="needs page_size"):
        NSACache.empty(NSAConfig(**CFG), 2, G, DK, DV, 16, block_table=torch.arange(2).view(2, 1))
