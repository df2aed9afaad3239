"""NSAAttention: the NSA attention layer (paper §3, Eq. 5) with prefill and decode.

Projections: queries, and separate keys/values per branch (paper §3.3.3: cmp, sel, win).
RoPE on queries and on every branch's keys at their absolute positions; compression keys get
RoPE *before* phi. Gates g = sigmoid(MLP(x)) of shape [B, T, HQ, 3] in order (cmp, slc, win).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from nsa_core import functional as F
from nsa_core.config import NSAConfig


class CompressionMLP(nn.Module):
    """Learnable phi: block [..., l, D] -> [..., D]. Intra-block position embedding is added,
    then flatten -> Linear -> GELU -> Linear (paper §3.3.1)."""

    def __init__(self, l: int, D: int, hidden: int | None = None):
        super().__init__()
        hidden = hidden or 2 * D
        self.pos = nn.Parameter(torch.randn(l, D) * 0.02)
        self.fc1 = nn.Linear(l * D, hidden)
        self.fc2 = nn.Linear(hidden, D)
        self.l, self.D = l, D

    def forward(self, blocks: torch.Tensor) -> torch.Tensor:
        if blocks.shape[-2:] != (self.l, self.D):
            raise ValueError(f"CompressionMLP expects blocks [..., {self.l}, {self.D}], got {tuple(blocks.shape)}")
        x = (blocks + self.pos.to(blocks.dtype)).flatten(-2)
        return self.fc2(nn.functional.gelu(self.fc1(x)))


def rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary embedding (half-split convention). x [B, T, H, D] (D even), positions [T]."""
    D = x.shape[-1]
    half = D // 2
    inv = 1.0 / (base ** (torch.arange(half, device=x.device, dtype=torch.float64) / half))
    ang = positions.to(torch.float64)[:, None] * inv[None, :]  # [T, half]
    cos = ang.cos().to(x.dtype)[None, :, None, :]
    sin = ang.sin().to(x.dtype)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


@dataclass
class BranchInputs:
    """Per-token projections of one call, RoPE applied. Shapes [B, T, heads, dim]."""

    q: torch.Tensor
    k_cmp: torch.Tensor
    v_cmp: torch.Tensor
    k_sel: torch.Tensor
    v_sel: torch.Tensor
    k_win: torch.Tensor
    v_win: torch.Tensor
    gates: torch.Tensor  # [B, T, HQ, 3]


class NSAAttention(nn.Module):
    """NSA attention layer.

    NSAAttention(dim, n_heads, n_kv_groups, d_k, d_v, cfg)
    forward(x [B, T, dim], cache=None) -> (y [B, T, dim], cache)
      cache=None: prefill of positions 0..T-1; returns a cache for decode.
      cache given: decode of the next tokens (see nsa_core.decode.cache).
    """

    def __init__(self, dim: int, n_heads: int, n_kv_groups: int, d_k: int, d_v: int,
                 cfg: NSAConfig | None = None, *, rope_base: float = 10000.0, gate_hidden: int | None = None,
                 backend="reference"):
        super().__init__()
        for name, v in (("dim", dim), ("n_heads", n_heads), ("n_kv_groups", n_kv_groups), ("d_k", d_k), ("d_v", d_v)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"NSAAttention: {name} must be a positive int, got {v!r}")
        if n_heads % n_kv_groups:
            raise ValueError(f"NSAAttention: n_heads={n_heads} must be a multiple of n_kv_groups={n_kv_groups}")
        if d_k % 2:
            raise ValueError(f"NSAAttention: d_k={d_k} must be even (RoPE rotates pairs)")
        self.cfg = cfg or NSAConfig()
        self.dim, self.HQ, self.G, self.dk, self.dv = dim, n_heads, n_kv_groups, d_k, d_v
        self.rope_base = rope_base
        self.backend = backend
        G = n_kv_groups
        self.q_proj = nn.Linear(dim, n_heads * d_k, bias=False)
        self.k_cmp_proj = nn.Linear(dim, G * d_k, bias=False)
        self.v_cmp_proj = nn.Linear(dim, G * d_v, bias=False)
        self.k_sel_proj = nn.Linear(dim, G * d_k, bias=False)
        self.v_sel_proj = nn.Linear(dim, G * d_v, bias=False)
        self.k_win_proj = nn.Linear(dim, G * d_k, bias=False)
        self.v_win_proj = nn.Linear(dim, G * d_v, bias=False)
        gh = gate_hidden or max(16, dim // 4)
        self.gate = nn.Sequential(nn.Linear(dim, gh), nn.SiLU(), nn.Linear(gh, n_heads * 3))
        self.o_proj = nn.Linear(n_heads * d_v, dim, bias=False)
        if self.cfg.phi == "mlp":
            self.phi_k = CompressionMLP(self.cfg.l, d_k)
            self.phi_v = CompressionMLP(self.cfg.l, d_v)
        else:
            self.phi_k = self.phi_v = None

    # ---- pieces shared by prefill and decode ---------------------------------------------
    def project(self, x: torch.Tensor, start: int = 0) -> BranchInputs:
        """Project tokens at absolute positions start..start+T-1; RoPE on q and all keys."""
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"NSAAttention: x must be [B, T, {self.dim}], got {tuple(x.shape)}")
        B, T, _ = x.shape
        pos = torch.arange(start, start + T, device=x.device)

        def heads(t, n, d):
            return t.view(B, T, n, d)

        def rk(t):
            return rope(t, pos, self.rope_base)

        G, HQ, dk, dv = self.G, self.HQ, self.dk, self.dv
        return BranchInputs(
            q=rk(heads(self.q_proj(x), HQ, dk)),
            k_cmp=rk(heads(self.k_cmp_proj(x), G, dk)),
            v_cmp=heads(self.v_cmp_proj(x), G, dv),
            k_sel=rk(heads(self.k_sel_proj(x), G, dk)),
            v_sel=heads(self.v_sel_proj(x), G, dv),
            k_win=rk(heads(self.k_win_proj(x), G, dk)),
            v_win=heads(self.v_win_proj(x), G, dv),
            gates=torch.sigmoid(self.gate(x)).view(B, T, HQ, 3),
        )

    def out(self, o: torch.Tensor) -> torch.Tensor:
        B, T = o.shape[:2]
        return self.o_proj(o.reshape(B, T, self.HQ * self.dv))

    # ---- forward ------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, cache=None, *, max_len: int | None = None, page_size: int | None = None):
        """Prefill (cache=None) or decode (cache from an earlier call); returns (y, cache).

        max_len: capacity to preallocate at prefill (default T + ``decode_headroom``); decode
        past it grows the cache by doubling (never per step). page_size: a paged raw KV cache
        (block table; nsa_core.decode.cache) instead of a dense one.
        """
        if cache is not None:
            return self._decode(x, cache)
        p = self.project(x, 0)
        o = F.nsa_attention(p.q, p.k_cmp, p.v_cmp, p.k_sel, p.v_sel, p.k_win, p.v_win, p.gates, self.cfg,
                            self.backend, phi_k=self.phi_k, phi_v=self.phi_v)
        return self.out(o), self._make_cache(p, max_len=max_len, page_size=page_size)

    # ---- decode (DESIGN §4; nsa_core.decode: cache, reference, static) --------------
    decode_headroom = 1024  # default extra capacity after a prefill of T tokens

    @torch.no_grad()
    def _make_cache(self, p: BranchInputs, max_len: int | None = None, page_size: int | None = None):
        """Fill an NSACache from a prefill's projections (the compressed tokens prefill used)."""
        from nsa_core.decode.cache import NSACache

        B, T = p.q.shape[:2]
        if max_len is not None and (not isinstance(max_len, int) or max_len < T):
            raise ValueError(f"NSAAttention: max_len={max_len!r} must be an int >= the prefill length {T}")
        cap = max_len if max_len is not None else T + self.decode_headroom
        cache = NSACache.empty(self.cfg, B, self.G, self.dk, self.dv, cap, dtype=p.k_sel.dtype,
                               device=p.k_sel.device, page_size=page_size)
        kc = F.compress(p.k_cmp, self.cfg, self.phi_k)
        vc = F.compress(p.v_cmp, self.cfg, self.phi_v)
        cache.fill_(p.k_cmp, p.v_cmp, p.k_sel, p.v_sel, p.k_win, p.v_win, kc, vc)
        return cache

    def new_cache(self, B: int, max_len: int, *, dtype=None, device=None, page_size: int | None = None,
                  block_table=None):
        """An empty NSACache for this layer (decode from position 0, or a direct fill); page_size /
        block_table: a paged raw KV cache (nsa_core.decode.cache)."""
        from nsa_core.decode.cache import NSACache

        w = self.q_proj.weight
        return NSACache.empty(self.cfg, B, self.G, self.dk, self.dv, max_len, dtype=dtype or w.dtype,
                              device=device or w.device, page_size=page_size, block_table=block_table)

    def _check_cache(self, x: torch.Tensor, cache) -> None:
        from nsa_core.decode.cache import NSACache

        if not isinstance(cache, NSACache):
            raise ValueError(f"NSAAttention: cache must be an NSACache (from a prefill), got {type(cache).__name__}")
        if cache.cfg != self.cfg:
            raise ValueError(f"NSAAttention: cache was built for {cache.cfg}, this layer uses {self.cfg}")
        want = (self.G, self.dk, self.dv)
        got = (cache.groups, cache.K_sel.shape[-1], cache.V_sel.shape[-1])
        if got != want:
            raise ValueError(f"NSAAttention: cache has (G, dk, dv) = {got}, this layer {want}")
        if x.dim() != 3 or x.shape[0] != cache.batch:
            raise ValueError(f"NSAAttention: decode input must be [B={cache.batch}, T, {self.dim}], "
                             f"got {tuple(x.shape)}")

    @torch.no_grad()
    def _decode(self, x: torch.Tensor, cache):
        """Decode x [B, k, dim] (k >= 1 new tokens at positions cache.length..) one token at a time.

        Each token is appended to every branch cache, then attends exactly as prefill would at
        its position (nsa_core.decode.reference.attend). Runs without autograd. cache.reads holds the
        last token's read counters, cache.reads_per_step one dict per token.
        """
        from nsa_core.decode import reference as _decode
        from nsa_core.decode.cache import read_counts

        self._check_cache(x, cache)
        B, T, _ = x.shape
        if T == 0:
            raise ValueError("NSAAttention: decode needs at least one new token")
        t0 = cache.length
        p = self.project(x, t0)
        cache.reserve(t0 + T)
        outs, per_step = [], []
        for i in range(T):
            t = t0 + i
            cache.append_(p.k_cmp[:, i], p.v_cmp[:, i], p.k_sel[:, i], p.v_sel[:, i], p.k_win[:, i],
                          p.v_win[:, i], self.phi_k, self.phi_v)
            o, idx, cnt = _decode.attend(p.q[:, i:i + 1], p.gates[:, i:i + 1], cache, t, self.cfg, self.backend)
            outs.append(o)
            per_step.append(read_counts(t + 1, idx[:, 0], cnt[:, 0], self.cfg))
            cache.last_selection = torch.where(
                torch.arange(idx.shape[-1], device=idx.device) < cnt[:, 0, :, None], idx[:, 0], -1)
        cache.reads, cache.reads_per_step = per_step[-1], per_step
        o = torch.cat(outs, dim=1) if T > 1 else outs[0]
        return self.out(o), cache

    def decoder(self, cache, **kw):
        """A static-shape (CUDA-graph capturable) decode stepper over ``cache``: see
        nsa_core.decode.static.StaticDecoder."""
        from nsa_core.decode.static import StaticDecoder

        return StaticDecoder(self, cache, **kw)
