"""Read counters of the decode step (DESIGN §4), exact per step and per KV group.

reads_cmp = visible compressed tokens, reads_sel = tokens <= t inside the selected blocks,
reads_win = min(w, s) for cached length s = t + 1; totals against the paper's Table 4.
"""

from __future__ import annotations

import pytest
import torch

from nsa_core import NSAAttention, NSAConfig
from nsa_core.decode.cache import formula_reads, paper_bound, read_counts

SMALL = NSAConfig(l=8, d=4, l_sel=16, n_sel=4, w=16)
PAPER = NSAConfig()  # l=32, d=16, l'=64, n=16, w=512
TABLE4 = {8192: 2048, 16384: 2560, 32768: 3584, 65536: 5632}  # tokens per step, paper Table 4


def _brute_sel(selection: torch.Tensor, t: int, l_sel: int) -> torch.Tensor:
    """Tokens p <= t whose block p // l_sel is selected, counted one by one. selection [B, G, n]."""
    blocks = torch.arange(t + 1) // l_sel  # [s]
    hit = (blocks[None, None, :, None] == selection[:, :, None, :].cpu()).any(-1)  # [B, G, s]
    return hit.sum(-1)


def test_formula_by_hand():
    # s = 70: 16 compressed (i*4+7 <= 69 -> i <= 15), 5 candidate blocks > n=4 -> 3*16 + 6, window 16
    assert formula_reads(70, SMALL) == {"cmp": 16, "sel": 54, "win": 16}
    assert formula_reads(7, SMALL) == {"cmp": 0, "sel": 7, "win": 7}
    assert formula_reads(8, SMALL) == {"cmp": 1, "sel": 8, "win": 8}
    assert formula_reads(64, SMALL) == {"cmp": 15, "sel": 64, "win": 16}
    assert formula_reads(65, SMALL) == {"cmp": 15, "sel": 49, "win": 16}


@pytest.mark.parametrize("phi", ["avg", "mlp"])
def test_counters_exact_every_step(phi):
    """Eager and static decode, every step from s=2 to s=90: counters == formula == brute force."""
    torch.manual_seed(0)
    cfg = NSAConfig(l=8, d=4, l_sel=16, n_sel=4, w=16, phi=phi)
    m = NSAAttention(16, 4, 2, 8, 4, cfg).double()
    x = torch.randn(2, 90, 16, dtype=torch.float64)
    _, cache = m(x[:, :1], max_len=96)
    _, cache_s = m(x[:, :1], max_len=96)
    dec = m.decoder(cache_s)
    for t in range(1, 90):
        _, cache = m(x[:, t:t + 1], cache)
        dec.step(x[:, t:t + 1])
        want = formula_reads(t + 1, cfg)
        for c in (cache, cache_s):
            for k in ("cmp", "sel", "win"):
                got = c.reads[k]
                assert got.shape == (2, 2) and got.dtype == torch.long
                assert (got == want[k]).all(), f"t={t} {k}: {got.tolist()} != {want[k]}"
            sel = c.last_selection
            assert torch.equal(_brute_sel(sel.clamp_min(-1), t, cfg.l_sel), c.reads["sel"].cpu()), f"t={t}"


def test_read_counts_of_a_given_selection():
    """read_counts counts only live slots and only tokens <= t of each block."""
    s = 70  # t = 69: block 4 holds tokens 64..69 (6 of them)
    idx = torch.tensor([[[0, 2, 3, 4], [0, 3, 4, -1]]])  # B=1, G=2
    r = read_counts(s, idx, None, SMALL)
    assert r["sel"].tolist() == [[16 * 3 + 6, 16 * 2 + 6]]
    assert r["cmp"].tolist() == [[16, 16]] and r["win"].tolist() == [[16, 16]]
    cnt = torch.tensor([[2, 3]])
    assert read_counts(s, idx, cnt, SMALL)["sel"].tolist() == [[32, 16 + 16 + 6]]
    r0 = read_counts(torch.tensor(5), torch.tensor([[[0, -1, -1, -1]]]), None, SMALL)
    assert r0["sel"].tolist() == [[5]] and r0["cmp"].tolist() == [[0]] and r0["win"].tolist() == [[5]]


@pytest.mark.parametrize("s", sorted(TABLE4))
def test_paper_bound_totals(s):
    """Paper config: the counter function fed a selection of n blocks (block 0, the two local
    ones, 13 others) gives the Table 4 total within rounding; no s-long tensor is built."""
    cur = (s - 1) // PAPER.l_sel
    blocks = [0, *range(5, 5 + PAPER.n_sel - 3), cur - 1, cur]
    idx = torch.tensor(blocks)[None, None]
    r = read_counts(s, idx, None, PAPER)
    total = sum(int(v) for v in r.values())
    assert {k: int(v) for k, v in r.items()} == formula_reads(s, PAPER)
    assert abs(total - TABLE4[s]) <= 1, (total, TABLE4[s])
    assert abs(total - paper_bound(s, PAPER)) <= 1
    assert s / total > 3.9  # 4x at 8k ... 11.6x at 64k: fewer reads than full attention
    if s == 65536:
        assert s / total == pytest.approx(11.6, abs=0.05)


@pytest.mark.parametrize("s", [8192, 65536])
def test_real_step_counters_at_long_context(s):
    """One real decode step (eager and static) at cached length s with the paper geometry and
    tiny dims (direct random cache fill): counters == formula, total == Table 4 within rounding."""
    torch.manual_seed(1)
    m = NSAAttention(16, 2, 2, 8, 8, PAPER)
    x = torch.randn(1, 1, 16)
    for static in (False, True):
        cache = m.new_cache(1, s)
        cache.fill_random_(s - 1, generator=torch.Generator().manual_seed(2))
        if static:
            m.decoder(cache).step(x)
        else:
            _, cache = m(x, cache)
        want = formula_reads(s, PAPER)
        got = {k: v.tolist() for k, v in cache.reads.items()}
        assert got == {k: [[v, v]] for k, v in want.items()}, (static, got, want)
        assert abs(sum(want.values()) - TABLE4[s]) <= 1


def test_counter_input_errors():
    with pytest.raises(ValueError, match="block_idx"):
        read_counts(10, torch.zeros(2, 3, dtype=torch.long), None, SMALL)
    with pytest.raises(ValueError, match="block_count"):
        read_counts(10, torch.zeros(1, 2, 4, dtype=torch.long), torch.zeros(2, 1), SMALL)
    with pytest.raises(ValueError, match="positive"):
        formula_reads(0, SMALL)
