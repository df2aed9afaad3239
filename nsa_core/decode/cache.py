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

**Paged option** (``NSACache.empty(..., page_size=P)``), as vLLM / FlashInfer hold KV: the raw
selection cache -- the one that grows with the context -- lives in a pool of pages
``K_sel, V_sel [num_pages, G, P, dk|dv]`` (FlashInfer's HND page layout) and ``block_table
[B, pages per sequence]`` (int32) maps page i of sequence b (tokens i*P .. i*P + P-1) to its
physical page. Token t of sequence b, group g sits at ``K_sel[block_table[b, t // P], g, t % P]``.
The dense cache is the special case of one page per sequence (``page_size = capacity``, table
``[[0], [1], ...]``): ``page_table()`` returns that, so the kernels take one addressing rule. The
compressed cache and the two rings stay dense (bounded, or 1/d of the context). Pages are given
out interleaved across the sequences by default (page i of sequence b is ``i * B + b``), so no
sequence's pages are contiguous and a wrong lookup cannot pass by accident; a caller can pass its
own table (``block_table=``, e.g. from a serving engine's allocator).
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

import math
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
    block_table: torch.Tensor | None = None  # paged: [B, pages per sequence] int32 physical page ids
    _dense_table: torch.Tensor | None = field(default=None, repr=False)

    # ---- construction --------------------------------------------------------------------
    @classmethod
    def empty(cls, cfg: NSAConfig, B: int, G: int, dk: int, dv: int, max_len: int, *,
              dtype=torch.float32, device=None, page_size: int | None = None,
              block_table: torch.Tensor | None = None) -> NSACache:
        """Zeroed caches for up to ``max_len`` tokens (rounded up to a multiple of l_sel).

        ``page_size``: page the raw selection cache (see the module docstring); the capacity is
        then rounded up to a multiple of both l_sel and page_size. ``block_table`` [B, pages]
        (int, distinct ids in 0..B*pages-1): the caller's page assignment; default interleaved."""
        for name, v in (("B", B), ("G", G), ("dk", dk), ("dv", dv), ("max_len", max_len)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"NSACache.empty: {name} must be a positive int, got {v!r}")
        if page_size is None:
            if block_table is not None:
                raise ValueError("NSACache.empty: block_table needs page_size")
            cap = _round_up(max_len, cfg.l_sel)
            ccap = max(1, cfg.num_cmp(cap))
            z = lambda n, D: torch.zeros(B, G, n, D, dtype=dtype, device=device)
            return cls(cfg, z(cap, dk), z(cap, dv), z(cfg.w, dk), z(cfg.w, dv), z(cfg.l, dk), z(cfg.l, dv),
                       z(ccap, dk), z(ccap, dv))
        if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size <= 0:
            raise ValueError(f"NSACache.empty: page_size must be a positive int, got {page_size!r}")
        cap = _round_up(max_len, math.lcm(cfg.l_sel, page_size))
        npp = cap // page_size
        table = _interleaved(B, npp, 0, device) if block_table is None else _check_table(block_table, B, npp, device)
        ccap = max(1, cfg.num_cmp(cap))
        z = lambda n, D: torch.zeros(B, G, n, D, dtype=dtype, device=device)
        pool = lambda D: torch.zeros(B * npp, G, page_size, D, dtype=dtype, device=device)
        return cls(cfg, pool(dk), pool(dv), z(cfg.w, dk), z(cfg.w, dv), z(cfg.l, dk), z(cfg.l, dv),
                   z(ccap, dk), z(ccap, dv), block_table=table)

    # ---- facts ---------------------------------------------------------------------------
    @property
    def paged(self) -> bool:
        return self.block_table is not None

    @property
    def page_size(self) -> int:
        """Tokens per page of the raw selection cache (the capacity when not paged)."""
        return self.K_sel.shape[2]

    @property
    def batch(self) -> int:
        return self.block_table.shape[0] if self.paged else self.K_sel.shape[0]

    @property
    def groups(self) -> int:
        return self.K_sel.shape[1]

    @property
    def capacity(self) -> int:
        return self.block_table.shape[1] * self.page_size if self.paged else self.K_sel.shape[2]

    def page_table(self) -> torch.Tensor:
        """[B, pages per sequence] int32 physical page ids of the raw selection cache: the block
        table, or ``[[0], [1], ...]`` for a dense cache (one page of ``capacity`` tokens each)."""
        if self.paged:
            return self.block_table
        if self._dense_table is None or self._dense_table.device != self.device:
            self._dense_table = torch.arange(self.batch, dtype=torch.int32, device=self.device)[:, None]
        return self._dense_table

    def sel_rows(self, tok: torch.Tensor) -> torch.Tensor:
        """Row ids in ``K_sel.view(-1, D)`` of tokens ``tok`` (positions < capacity: [n], [B, n] or
        per group [B, G, n]) -> [B, G, n] int64: row = (page * G + g) * page_size + tok % page_size
        with page = page_table()[b, tok // page_size]. No host sync (graph capturable)."""
        P, B, G = self.page_size, self.batch, self.groups
        tok = tok.to(torch.long)
        if tok.dim() == 1:
            tok = tok.expand(B, -1)
        if tok.dim() == 2:
            tok = tok[:, None, :].expand(B, G, -1)
        n = tok.shape[-1]
        page = torch.gather(self.page_table().long(), 1, (tok // P).reshape(B, G * n)).view(B, G, n)
        g = torch.arange(G, device=tok.device)[None, :, None]
        return (page * G + g) * P + tok % P

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
        """Raw selection-branch keys/values of tokens 0..s-1 as [B, s, G, D] (views; a gathered
        copy when paged)."""
        s = self.length if s is None else s
        if not self.paged:
            return self.K_sel[:, :, :s].transpose(1, 2), self.V_sel[:, :, :s].transpose(1, 2)
        K, V = self.sel_dense(s)
        return K.transpose(1, 2), V.transpose(1, 2)

    def sel_dense(self, s: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw selection-branch keys/values of tokens 0..s-1 as [B, G, s, D] (dense: views)."""
        s = self.length if s is None else s
        if not self.paged:
            return self.K_sel[:, :, :s], self.V_sel[:, :, :s]
        rows = self.sel_rows(torch.arange(s, device=self.device))
        return tuple(X.reshape(-1, X.shape[-1])[rows] for X in (self.K_sel, self.V_sel))

    def _write_sel(self, tok: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """K_sel/V_sel of tokens ``tok`` [n] <- k [B, G, n, dk], v [B, G, n, dv] (any layout)."""
        if not self.paged:
            self.K_sel[:, :, tok] = k
            self.V_sel[:, :, tok] = v
            return
        rows = self.sel_rows(tok)
        self.K_sel.view(-1, self.K_sel.shape[-1])[rows] = k.to(self.dtype)
        self.V_sel.view(-1, self.V_sel.shape[-1])[rows] = v.to(self.dtype)

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
        if self.paged:  # new pages at the end of the pool, given out interleaved as at creation
            P, B = self.page_size, self.batch
            cap = _round_up(max(n, 2 * self.capacity), math.lcm(cfg.l_sel, P))
            old_pages, extra = self.block_table.shape[1], cap // P - self.block_table.shape[1]
            first = self.K_sel.shape[0]
            for name in ("K_sel", "V_sel"):
                old = getattr(self, name)
                setattr(self, name, torch.cat([old, old.new_zeros(B * extra, *old.shape[1:])]))
            new = _interleaved(B, extra, first, self.device)
            self.block_table = torch.cat([self.block_table, new], 1).contiguous()
            assert self.block_table.shape[1] == old_pages + extra
            growing = ()
        else:
            cap = _round_up(max(n, 2 * self.capacity), cfg.l_sel)
            growing = (("K_sel", cap), ("V_sel", cap))
        ccap = max(1, cfg.num_cmp(cap))
        for name, new_len in (*growing, ("K_cmp", ccap), ("V_cmp", ccap)):
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
        self._write_sel(torch.arange(T, device=self.device), hm(k_sel), hm(v_sel))
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
        self._write_sel(torch.tensor([t], device=self.device), k_sel[:, :, None], v_sel[:, :, None])
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
            if name in ("K_sel", "V_sel") and self.paged:  # the pages of tokens 0..S-1
                r = torch.randn(self.batch, self.groups, S, t.shape[3], generator=generator, device=t.device,
                                dtype=torch.float32)
                rows = self.sel_rows(torch.arange(S, device=t.device))
                t.view(-1, t.shape[-1])[rows] = (r * scale).to(t.dtype)
                continue
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
        c = NSACache(self.cfg, *[t.clone() for t in self.tensors().values()], length=self.length,
                     block_table=None if self.block_table is None else self.block_table.clone())
        c.grown = self.grown
        return c

    def to(self, dtype=None, device=None) -> NSACache:
        c = NSACache(self.cfg, *[t.to(dtype=dtype, device=device) for t in self.tensors().values()],
                     length=self.length,
                     block_table=None if self.block_table is None else self.block_table.to(device=device))
        c.grown = self.grown
        return c


def _interleaved(B: int, pages: int, first: int, device) -> torch.Tensor:
    """[B, pages] int32: page i of sequence b is ``first + i * B + b`` (no sequence contiguous)."""
    return (first + torch.arange(pages, device=device)[None, :] * B
            + torch.arange(B, device=device)[:, None]).to(torch.int32).contiguous()


def _check_table(table: torch.Tensor, B: int, pages: int, device) -> torch.Tensor:
    if not isinstance(table, torch.Tensor) or table.dim() != 2 or tuple(table.shape) != (B, pages):
        raise ValueError(f"NSACache.empty: block_table must be a [B={B}, {pages}] tensor, got "
                         f"{tuple(table.shape) if isinstance(table, torch.Tensor) else type(table).__name__}")
    if table.dtype.is_floating_point or table.dtype == torch.bool:
        raise ValueError(f"NSACache.empty: block_table must hold integer page ids, got {table.dtype}")
    flat = table.flatten().long().cpu()
    if int(flat.min()) < 0 or int(flat.max()) >= B * pages or flat.unique().numel() != flat.numel():
        raise ValueError(f"NSACache.empty: block_table must hold distinct page ids in 0..{B * pages - 1}")
    return table.to(device=device, dtype=torch.int32).contiguous()
