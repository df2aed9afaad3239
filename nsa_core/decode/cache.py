"""NSACache: per-branch KV caches for NSA decode, and the exact read counters (DESIGN §4).

What the cache keeps, per layer (B sequences of equal length, G KV groups)::

    K_sel, V_sel   [B, G, cap, dk|dv]   raw selection-branch keys/values, token t at row t
    K_win, V_win   [B, G, w, dk|dv]     ring of the last w window-branch tokens, token t at slot t % w
    K_raw, V_raw   [B, G, l, dk|dv]     ring of the last l RAW compression-branch tokens (RoPE'd
                                        keys), token t at slot t % l: exactly what phi needs when a
                                        compressed block completes (avg and mlp alike)
    K_cmp, V_cmp   [B, G, cap_cmp, dk|dv]  compressed tokens; token i = phi(raw [i*d, i*d + l)),
                                        written at the step where t = i*d + l - 1 (every d steps
                                        once l tokens exist); cap_cmp = cfg.num_cmp(cap)

The layout is head-major ([B, G, T, D], one contiguous [T, D] slab per (sequence, group)) so a
decode kernel streams one group's keys contiguously and SDPA takes the buffers as they are.
``cap`` (capacity) is preallocated and rounded up to a multiple of ``l_sel``; a decode step never
allocates. Eager decode past the capacity grows the buffers by doubling (``reserve``), which is
counted in ``cache.grown``; a graph-captured step (``nsa_core.decode.static``) cannot grow and
raises instead.

Read counters (tokens read per KV group, per step, at cached length ``s = t + 1``)::

    reads_cmp = visible compressed tokens            = 0 if s < l else (s - l) // d + 1
    reads_sel = tokens <= t inside the selected blocks
    reads_win = min(w, s)

``read_counts`` computes them from the selection a step actually made; ``formula_reads`` is
the closed form they must equal (top-n always takes block 0, the current and the previous
block, and fills all n slots once there are more than n candidates); ``paper_bound`` is
Table 4's ``(s - l)/d + n*l' + w``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nsa_core.config import NSAConfig

# cache.reads keys, DESIGN §4 / docs/semantics.md: a public contract that names the selection branch
# "sel" (everywhere else in code it is "slc", nsa_core.config.BRANCHES)
READ_KEYS = ("cmp", "sel", "win")


# ---- read counters ---------------------------------------------------------------------------

def read_counts(s, block_idx: torch.Tensor, block_count: torch.Tensor | None, cfg: NSAConfig
                ) -> dict[str, torch.Tensor]:
    """Tokens read per KV group by one decode step at cached length ``s`` (= t + 1).

    s            int or 0-dim integer tensor (may live on the GPU: no host sync)
    block_idx    [B, G, n] selected block ids (-1 = unused slot), any integer dtype
    block_count  [B, G] number of live slots (None: live = id >= 0)
    -> {"cmp", "sel", "win"}: LongTensors [B, G] on block_idx's device.
    """
    if block_idx.dim() != 3:
        raise ValueError(f"read_counts: block_idx must be [B, G, n], got {tuple(block_idx.shape)}")
    B, G, n = block_idx.shape
    dev = block_idx.device
    s = torch.as_tensor(s, device=dev).to(torch.long)
    j = block_idx.to(torch.long)
    live = j >= 0
    if block_count is not None:
        if block_count.shape != (B, G):
            raise ValueError(f"read_counts: block_count must be [B, G] = [{B}, {G}], got {tuple(block_count.shape)}")
        live = live & (torch.arange(n, device=dev) < block_count[..., None].to(torch.long))
    toks = (s - j * cfg.l_sel).clamp(0, cfg.l_sel)  # tokens <= t of block j
    sel = torch.where(live, toks, torch.zeros_like(toks)).sum(-1)
    cmp = torch.where(s >= cfg.l, (s - cfg.l) // cfg.d + 1, torch.zeros_like(s))
    win = torch.clamp(s, max=cfg.w)
    return {"cmp": cmp.expand(B, G).clone(), "sel": sel, "win": win.expand(B, G).clone()}


def formula_reads(s: int, cfg: NSAConfig) -> dict[str, int]:
    """The closed form the counters of one step at cached length ``s`` must equal (per group)."""
    if s <= 0:
        raise ValueError(f"formula_reads: cached length must be positive, got {s}")
    cmp = cfg.num_cmp(s)
    if cfg.num_sel_blocks(s) <= cfg.n_sel:  # every candidate block is selected: all s tokens
        sel = s
    else:  # n blocks: n-1 complete ones and the current one up to t
        sel = (cfg.n_sel - 1) * cfg.l_sel + (s - 1) % cfg.l_sel + 1
    return {"cmp": cmp, "sel": sel, "win": min(cfg.w, s)}


def paper_bound(s: int, cfg: NSAConfig) -> float:
    """Table 4 of the paper: (s - l)/d + n*l' + w tokens per step (full attention reads s)."""
    return (s - cfg.l) / cfg.d + cfg.n_sel * cfg.l_sel + cfg.w


# ---- the cache -------------------------------------------------------------------------------

def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


@dataclass(eq=False)
class NSACache:
    """Per-branch KV caches of one NSA layer (see the module docstring for the layout).

    ``length`` is the number of cached tokens (host int: the next token's position).
    ``reads`` is the last decode step's counters: {"cmp", "sel", "win"} -> LongTensor [B, G]
    (None after prefill); ``reads_per_step`` keeps one such dict per token of the last call.
    """

    cfg: NSAConfig
    K_sel: torch.Tensor
    V_sel: torch.Tensor
    K_win: torch.Tensor
    V_win: torch.Tensor
    K_raw: torch.Tensor
    V_raw: torch.Tensor
    K_cmp: torch.Tensor
    V_cmp: torch.Tensor
    length: int = 0
    reads: dict | None = None
    reads_per_step: list = field(default_factory=list)
    last_selection: torch.Tensor | None = None  # [B, G, n] block ids of the last step (-1 = unused)
    grown: int = 0  # how many times eager decode had to grow the buffers

    # ---- construction --------------------------------------------------------------------
    @classmethod
    def empty(cls, cfg: NSAConfig, B: int, G: int, dk: int, dv: int, max_len: int, *,
              dtype=torch.float32, device=None) -> NSACache:
        """Zeroed caches for up to ``max_len`` tokens (rounded up to a multiple of l_sel)."""
        for name, v in (("B", B), ("G", G), ("dk", dk), ("dv", dv), ("max_len", max_len)):
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"NSACache.empty: {name} must be a positive int, got {v!r}")
        cap = _round_up(max_len, cfg.l_sel)
        ccap = max(1, cfg.num_cmp(cap))
        z = lambda n, D: torch.zeros(B, G, n, D, dtype=dtype, device=device)
        return cls(cfg, z(cap, dk), z(cap, dv), z(cfg.w, dk), z(cfg.w, dv), z(cfg.l, dk), z(cfg.l, dv),
                   z(ccap, dk), z(ccap, dv))

    # ---- facts ---------------------------------------------------------------------------
    @property
    def batch(self) -> int:
        return self.K_sel.shape[0]

    @property
    def groups(self) -> int:
        return self.K_sel.shape[1]

    @property
    def capacity(self) -> int:
        return self.K_sel.shape[2]

    @property
    def dtype(self) -> torch.dtype:
        return self.K_sel.dtype

    @property
    def device(self) -> torch.device:
        return self.K_sel.device

    @property
    def num_cmp(self) -> int:
        """Compressed tokens that exist (visible to the last cached token)."""
        return self.cfg.num_cmp(self.length)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {k: getattr(self, k) for k in ("K_sel", "V_sel", "K_win", "V_win", "K_raw", "V_raw", "K_cmp", "V_cmp")}

    # ---- views in the [B, T, G, D] API layout ------------------------------------------------
    def sel_kv(self, s: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw selection-branch keys/values of tokens 0..s-1 as [B, s, G, D] views."""
        s = self.length if s is None else s
        return self.K_sel[:, :, :s].transpose(1, 2), self.V_sel[:, :, :s].transpose(1, 2)

    def cmp_kv(self, n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The first n compressed tokens as [B, n, G, D] views (default: all that exist)."""
        n = self.num_cmp if n is None else n
        return self.K_cmp[:, :, :n].transpose(1, 2), self.V_cmp[:, :, :n].transpose(1, 2)

    def win_kv(self, t: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Window tokens max(0, t-w+1)..t in order, [B, m, G, D] (t default: the last cached token)."""
        t = self.length - 1 if t is None else t
        m = min(self.cfg.w, t + 1)
        slots = torch.arange(t - m + 1, t + 1, device=self.device) % self.cfg.w
        return (self.K_win.index_select(2, slots).transpose(1, 2),
                self.V_win.index_select(2, slots).transpose(1, 2))

    def raw_block(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw compression tokens t-l+1..t in order, [B, G, l, D] (needs t+1 >= l)."""
        slots = torch.arange(t - self.cfg.l + 1, t + 1, device=self.device) % self.cfg.l
        return self.K_raw.index_select(2, slots), self.V_raw.index_select(2, slots)

    # ---- writing ---------------------------------------------------------------------------
    def reserve(self, n: int) -> None:
        """Make room for n tokens: grow every growing buffer by doubling (eager decode only)."""
        if n <= self.capacity:
            return
        cfg = self.cfg
        cap = _round_up(max(n, 2 * self.capacity), cfg.l_sel)
        ccap = max(1, cfg.num_cmp(cap))
        for name, new_len in (("K_sel", cap), ("V_sel", cap), ("K_cmp", ccap), ("V_cmp", ccap)):
            old = getattr(self, name)
            buf = old.new_zeros(*old.shape[:2], new_len, old.shape[3])
            buf[:, :, :old.shape[2]] = old
            setattr(self, name, buf)
        self.grown += 1

    def fill_(self, k_cmp, v_cmp, k_sel, v_sel, k_win, v_win, kc: torch.Tensor, vc: torch.Tensor) -> None:
        """Load a prefill of T tokens: raw k_*/v_* [B, T, G, D] (RoPE'd keys) and the compressed
        tokens kc/vc [B, cfg.num_cmp(T), G, D] prefill computed. Sets length = T."""
        cfg = self.cfg
        B, T = k_sel.shape[:2]
        if (B, k_sel.shape[2]) != (self.batch, self.groups):
            raise ValueError(f"NSACache.fill_: tokens {tuple(k_sel.shape)} do not match the cache "
                             f"(B={self.batch}, G={self.groups})")
        if kc.shape[1] != cfg.num_cmp(T):
            raise ValueError(f"NSACache.fill_: {kc.shape[1]} compressed tokens for T={T}, expected {cfg.num_cmp(T)}")
        self.reserve(T)
        hm = lambda x: x.detach().transpose(1, 2).to(self.dtype)  # [B, T, G, D] -> [B, G, T, D]
        self.K_sel[:, :, :T] = hm(k_sel)
        self.V_sel[:, :, :T] = hm(v_sel)
        nc = kc.shape[1]
        self.K_cmp[:, :, :nc] = hm(kc)
        self.V_cmp[:, :, :nc] = hm(vc)
        for ring_k, ring_v, k, v, size in ((self.K_win, self.V_win, k_win, v_win, cfg.w),
                                           (self.K_raw, self.V_raw, k_cmp, v_cmp, cfg.l)):
            m = min(size, T)
            slots = torch.arange(T - m, T, device=self.device) % size
            ring_k[:, :, slots] = hm(k[:, T - m:])
            ring_v[:, :, slots] = hm(v[:, T - m:])
        self.length = T
        self.reads, self.reads_per_step, self.last_selection = None, [], None

    def append_(self, k_cmp, v_cmp, k_sel, v_sel, k_win, v_win, phi_k=None, phi_v=None) -> bool:
        """Append token t = length (each argument [B, G, D], keys RoPE'd). Runs phi on the block
        that completes at t, if any (phi None: mean). Returns whether a compressed token was made."""
        cfg = self.cfg
        t = self.length
        self.reserve(t + 1)
        self.K_sel[:, :, t] = k_sel
        self.V_sel[:, :, t] = v_sel
        self.K_win[:, :, t % cfg.w] = k_win
        self.V_win[:, :, t % cfg.w] = v_win
        self.K_raw[:, :, t % cfg.l] = k_cmp
        self.V_raw[:, :, t % cfg.l] = v_cmp
        self.length = t + 1
        if t + 1 < cfg.l or (t + 1 - cfg.l) % cfg.d:
            return False
        i = (t + 1 - cfg.l) // cfg.d
        bk, bv = self.raw_block(t)  # [B, G, l, D]
        self.K_cmp[:, :, i] = bk.mean(2) if phi_k is None else phi_k(bk).to(self.dtype)
        self.V_cmp[:, :, i] = bv.mean(2) if phi_v is None else phi_v(bv).to(self.dtype)
        return True

    def fill_random_(self, S: int, *, generator: torch.Generator | None = None, scale: float = 1.0) -> None:
        """Direct cache fill for benchmarks: S tokens of independent random data in every cache
        (the compressed cache is NOT the compression of the raw one). Sets length = S."""
        if S <= 0:
            raise ValueError(f"fill_random_: S must be positive, got {S}")
        self.reserve(S)
        for name, t in self.tensors().items():
            n = t.shape[2]
            if name in ("K_sel", "V_sel"):
                n = S
            elif name in ("K_cmp", "V_cmp"):
                n = self.cfg.num_cmp(S)
            if n:
                r = torch.randn(t.shape[0], t.shape[1], n, t.shape[3], generator=generator, device=t.device,
                                dtype=torch.float32)
                t[:, :, :n] = (r * scale).to(t.dtype)
        self.length = S
        self.reads, self.reads_per_step, self.last_selection = None, [], None

    def clone(self) -> NSACache:
        c = NSACache(self.cfg, *[t.clone() for t in self.tensors().values()], length=self.length)
        c.grown = self.grown
        return c

    def to(self, dtype=None, device=None) -> NSACache:
        c = NSACache(self.cfg, *[t.to(dtype=dtype, device=device) for t in self.tensors().values()],
                     length=self.length)
        c.grown = self.grown
        return c
