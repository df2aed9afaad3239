"""Eq. 11 top-n, exact ties among many candidate blocks: the lower block index wins, whatever
the number of blocks (a mutation survivor, docs/testing.md: with ``stable=False`` torch's CPU
sort keeps index order for a few elements but not for dozens, so small tie tests cannot see it).
"""

from __future__ import annotations

import pytest
import torch

from nsa_core import NSAConfig
from nsa_core.selection.reference import topn_blocks


@pytest.mark.parametrize("NB", [40, 200, 1000])
def test_ties_go_to_the_lower_index_with_many_blocks(NB):
    cfg = NSAConfig(l=16, d=8, l_sel=16, n_sel=8, w=32)
    T = NB * cfg.l_sel
    t_pos = torch.tensor([T - 1, T // 2])
    g = torch.Generator().manual_seed(NB)
    # two tie levels, shuffled over the blocks: the winners are the lowest indices of the top level
    scores = torch.randint(0, 2, (1, 2, 2, NB), generator=g).double()
    idx, cnt = topn_blocks(scores, t_pos, cfg)
    for q, t in enumerate(t_pos.tolist()):
        cur = t // cfg.l_sel
        forced = {0, cur, cur - 1}
        for grp in range(2):
            s = scores[0, q, grp, : cur + 1]
            others = [j for j in range(cur + 1) if j not in forced]
            ranked = sorted(others, key=lambda j: (-float(s[j]), j))  # score, then lower index
            want = sorted(forced | set(ranked[: cfg.n_sel - len(forced)]))
            assert idx[0, q, grp].tolist() == want, (NB, t, grp)
            assert int(cnt[0, q, grp]) == cfg.n_sel
