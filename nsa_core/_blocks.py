"""Block geometry of NSA (DESIGN §2): visibility, the overlap mapping of Eq. 9, top-n of Eq. 11.

Everything here is vectorised torch on index tensors; no per-token Python loops.
Query positions are explicit (``t_pos``) so the same code serves prefill (t = 0..T-1) and
decode (one query at t = s-1 against s cached tokens).
"""

from __future__ import annotations

import torch

from nsa_core.config import NSAConfig


def num_cmp_visible(t: torch.Tensor, cfg: NSAConfig) -> torch.Tensor:
    """Compressed tokens visible to query position(s) ``t``: 0 if t+1 < l else (t+1-l)//d + 1."""
    t = torch.as_tensor(t)
    return torch.where(t + 1 < cfg.l, torch.zeros_like(t), (t + 1 - cfg.l) // cfg.d + 1)


def cmp_visibility_mask(t_pos: torch.Tensor, n_cmp: int, cfg: NSAConfig) -> torch.Tensor:
    """Bool [Tq, n_cmp]: compressed token i is visible to query t iff i*d + l - 1 <= t."""
    i = torch.arange(n_cmp, device=t_pos.device)
    return (i[None, :] * cfg.d + cfg.l - 1) <= t_pos[:, None]


def overlap_matrix(n_cmp: int, n_blocks: int, cfg: NSAConfig, *, device=None,
                   dtype=torch.float32) -> torch.Tensor:
    """[n_cmp, n_blocks] weights: overlap, in units of d, of compressed block i with selection block j.

    Compressed block i covers raw tokens [i*d, i*d + l); selection block j covers
    [j*l_sel, (j+1)*l_sel). This equals the double sum of DESIGN §2 (the corrected Eq. 9):
    p_slc[j] = sum_{m<a} sum_{n<b} p_cmp[j*a + m - n], a = l_sel/d, b = l/d.
    """
    i = torch.arange(n_cmp, device=device)
    j = torch.arange(n_blocks, device=device)
    c0, c1 = i * cfg.d, i * cfg.d + cfg.l
    s0, s1 = j * cfg.l_sel, (j + 1) * cfg.l_sel
    ov = (torch.minimum(c1[:, None], s1[None, :]) - torch.maximum(c0[:, None], s0[None, :])).clamp_min(0)
    return (ov // cfg.d).to(dtype)


def topn_blocks(scores: torch.Tensor, t_pos: torch.Tensor, cfg: NSAConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 11. scores [B, Tq, G, NB] (per group) -> block_idx [B, Tq, G, n] int32, block_count [B, Tq, G].

    Candidates for t: j <= t // l_sel. Forced: block 0 and the local blocks t//l_sel and
    t//l_sel - 1. Remaining slots go to the highest-scoring other candidates; ties go to the
    lower index. Chosen ids ascending, then -1 padding.
    """
    B, Tq, G, NB = scores.shape
    n = cfg.n_sel
    dev = scores.device
    j = torch.arange(NB, device=dev)
    cur = (t_pos // cfg.l_sel).to(dev)  # [Tq]
    cand = j[None, :] <= cur[:, None]  # [Tq, NB]
    forced = (j[None, :] == 0) | (j[None, :] == cur[:, None]) | (j[None, :] == cur[:, None] - 1)
    forced = forced & cand
    s = scores.detach().to(torch.float64)
    s = torch.where(forced[None, :, None, :], torch.full_like(s, float("inf")), s)
    s = torch.where(cand[None, :, None, :], s, torch.full_like(s, float("-inf")))
    k = min(n, NB)
    # stable descending sort: among equal scores the lower index stays first (ties -> lower index)
    order = torch.sort(s, dim=-1, descending=True, stable=True).indices[..., :k]
    count = cand.sum(-1).clamp(max=n).to(torch.int32)  # [Tq]
    slot = torch.arange(k, device=dev)
    valid = slot[None, :] < count[:, None]  # [Tq, k]
    big = torch.iinfo(torch.int64).max
    chosen = torch.where(valid[None, :, None, :], order, torch.full_like(order, big))
    chosen = torch.sort(chosen, dim=-1).values
    chosen = torch.where(chosen == big, torch.full_like(chosen, -1), chosen)
    if k < n:
        pad = torch.full((B, Tq, G, n - k), -1, dtype=chosen.dtype, device=dev)
        chosen = torch.cat([chosen, pad], dim=-1)
    block_count = count[None, :, None].expand(B, Tq, G).contiguous()
    return chosen.to(torch.int32).contiguous(), block_count


def selected_token_mask(block_idx: torch.Tensor, block_count: torch.Tensor, t_pos: torch.Tensor,
                        S: int, block_size: int) -> torch.Tensor:
    """Bool [B, G, Tq, S]: key s is attended by query t of group g (s in a selected block and s <= t)."""
    B, Tq, G, n = block_idx.shape
    NB = (S + block_size - 1) // block_size
    slot = torch.arange(n, device=block_idx.device)
    live = slot[None, None, None, :] < block_count[..., None]
    idx = torch.where(live, block_idx.long(), torch.full_like(block_idx, NB, dtype=torch.long))
    blk = torch.zeros(B, Tq, G, NB + 1, dtype=torch.bool, device=block_idx.device)
    blk.scatter_(-1, idx, True)
    blk = blk[..., :NB]
    key_block = torch.arange(S, device=block_idx.device) // block_size  # [S]
    tok = blk[..., key_block]  # [B, Tq, G, S]
    causal = torch.arange(S, device=block_idx.device)[None, :] <= t_pos[:, None].to(block_idx.device)
    tok = tok & causal[None, :, None, :]
    return tok.permute(0, 2, 1, 3)


def window_mask(t_pos: torch.Tensor, S: int, w: int) -> torch.Tensor:
    """Bool [Tq, S]: key s visible to query t iff max(0, t-w+1) <= s <= t."""
    s = torch.arange(S, device=t_pos.device)
    return (s[None, :] <= t_pos[:, None]) & (s[None, :] > t_pos[:, None] - w)


def causal_mask(t_pos: torch.Tensor, S: int) -> torch.Tensor:
    s = torch.arange(S, device=t_pos.device)
    return s[None, :] <= t_pos[:, None]
