"""Selection branch reference (docs/semantics.md): the overlap map of Eq. 9, top-n of Eq. 11, the
selected-token mask and the selection attention of Eq. 12 (dense, float64-capable: the oracle).

Everything here is vectorised torch on index tensors; no per-token Python loops.
Query positions are explicit (``t_pos``) so the same code serves prefill (t = 0..T-1) and
decode (one query at t = s-1 against s cached tokens).
"""

from __future__ import annotations

import torch

from nsa_core._dense import _positions, masked_attention
from nsa_core._shapes import check_qkv
from nsa_core.config import NSAConfig


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


def selection_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_idx: torch.Tensor,
                        block_count: torch.Tensor, block_size: int, scale: float | None = None,
                        engine: str = "math") -> torch.Tensor:
    """Attention over the raw tokens of the selected blocks, causally masked (Eq. 12).

    q [B, Tq, HQ, dk]; k [B, S, G, dk]; v [B, S, G, dv]; block_idx [B, Tq, G, n] int
    (ascending ids, -1 padded); block_count [B, Tq, G]. -> o [B, Tq, HQ, dv].
    """
    B, Tq, HQ, G, S = check_qkv(q, k, v, causal=True)
    if block_idx.shape[:3] != (B, Tq, G) or block_count.shape != (B, Tq, G):
        raise ValueError(
            f"block_idx {tuple(block_idx.shape)} / block_count {tuple(block_count.shape)} must be "
            f"[B, T, G, n] / [B, T, G] = [{B}, {Tq}, {G}, n] / [{B}, {Tq}, {G}]")
    def key_range(t0, t1):  # causal: no key after the chunk's last query
        return 0, t1

    def mask_fn(t, c0, c1):
        s1 = int(t[-1]) + 1
        return selected_token_mask(block_idx[:, c0:c1], block_count[:, c0:c1], t, s1, block_size)

    return masked_attention(q, k, v, _positions(Tq, S, q.device), mask_fn, scale, engine, key_range=key_range)
