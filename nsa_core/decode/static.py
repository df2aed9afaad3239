"""Static-shape NSA decode step (DESIGN §4 fast path): CUDA-graph capturable.

``StaticDecoder(module, cache, impl="torch"|"triton")`` runs one decode step over a
preallocated ``NSACache`` with shapes fixed by the cache capacity: the position lives in a
device tensor (``dec.pos``), visibility is a mask over the whole capacity instead of a slice by
a Python int, and nothing reads a value back to the host, so a whole step (or any one part of
it) can be captured in a ``torch.cuda.CUDAGraph`` and replayed at any position.

The math is the prefill math for one query at position t (nsa_core.decode.reference.attend is the
eager form; tests compare the two in float64):

- append: token t goes to K_sel/V_sel row t, the window ring slot t % w and the raw
  compression ring slot t % l; when a compressed block completes (t + 1 >= l and
  (t + 1 - l) % d == 0) phi runs on the ring's tokens t-l+1..t, in order, and the result is
  written to compressed row (t + 1 - l) // d (a masked write: the same kernels run every step).
- compressed branch: softmax over the compressed tokens visible at t, times V_cmp.
- selection: the same probabilities summed over the group's heads (Eq. 10), mapped to
  selection blocks with the overlap weights (Eq. 9, as a width-l/d box sum over d-units, then
  a sum over each block's l_sel/d units), top-n with block 0 and the two local blocks forced;
  then attention over the raw tokens of the chosen blocks (gathered by block), causal.
- window branch: attention over the ring, slots < t + 1.
- gates combine the three outputs (Eq. 5); projections and RoPE (a table over the capacity)
  around it.

Ties in top-n: the torch path uses ``torch.topk`` (the order among exactly equal scores is not
specified); the Triton path and the reference pick the lower block id. With random inputs
exact ties have probability zero.

Attribution (decode-bench shares): the pieces run inside ``nsa::<label>`` profiler scopes
(nsa_core.decode.labels).
"""

from __future__ import annotations

import math

import torch

from nsa_core.decode.cache import NSACache, read_counts
from nsa_core.decode.labels import scope as _scope

# fused: the attention part in two Triton launches (kernels.py); split: two launches, split-K in both, the
# block scores from the chunks' per-tile block partials (no logits), sized from the SM count (issue 14)
IMPLS = ("torch", "triton", "fused", "split")
TRITON_IMPLS = ("triton", "fused", "split")


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def rope_table(cap: int, dk: int, base: float, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [cap, dk/2] in ``dtype``, computed exactly as nsa_core.module.rope does."""
    half = dk // 2
    inv = 1.0 / (base ** (torch.arange(half, device=device, dtype=torch.float64) / half))
    ang = torch.arange(cap, device=device, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().to(dtype), ang.sin().to(dtype)


class StaticDecoder:
    """One-token decode steps over ``cache`` with static shapes (see the module docstring).

    Buffers: ``x`` [B, 1, dim] input, ``pos`` 0-dim int64 (position of the token being
    decoded), ``y`` [B, 1, dim] output, ``blk`` [B, G, n] int64 block ids of the last step
    (-1 = unused slot). Pieces (each usable alone, e.g. to time a branch in isolation):
    ``project``, ``append``, ``cmp``, ``select``, ``slc``, ``win``, ``combine``, ``attn``,
    ``run_step``. ``step(x)`` is the eager convenience: copy in, run (or replay the captured
    graph), advance ``cache.length``, set ``cache.reads``.

    The projection weights are copied (fused) at construction: call ``refresh()`` after the
    module's weights change.
    """

    def __init__(self, module, cache: NSACache, *, impl: str = "torch", scale: float | None = None,
                 chunk: int | None = None, warps: dict | None = None, tune: dict | None = None):
        if impl not in IMPLS:
            raise ValueError(f"StaticDecoder: impl must be one of {IMPLS}, got {impl!r}")
        if impl in TRITON_IMPLS and cache.device.type == "cpu":
            import os

            if os.environ.get("TRITON_INTERPRET") != "1":
                raise ValueError(f"StaticDecoder(impl='{impl}') on CPU needs TRITON_INTERPRET=1 set before triton "
                                 "is imported")
        module._check_cache(torch.empty(cache.batch, 1, module.dim), cache)
        self.m, self.cache, self.cfg, self.impl = module, cache, module.cfg, impl
        cfg = self.cfg
        B, G, HQ, dk, dv = cache.batch, module.G, module.HQ, module.dk, module.dv
        self.B, self.G, self.HQ, self.h, self.dk, self.dv = B, G, HQ, HQ // G, dk, dv
        self.dtype, self.device = cache.dtype, cache.device
        self.acc = _acc_dtype(self.dtype)
        self.scale = 1.0 / math.sqrt(dk) if scale is None else scale
        self.cap = cache.capacity
        self.ccap = cache.K_cmp.shape[2]
        self.NB = self.cap // cfg.l_sel
        self.n = min(cfg.n_sel, self.NB)
        dev = self.device
        self.x = torch.zeros(B, 1, module.dim, dtype=self.dtype, device=dev)
        self.pos = torch.zeros((), dtype=torch.long, device=dev)
        self.y = torch.zeros(B, 1, module.dim, dtype=self.dtype, device=dev)
        self.blk = torch.full((B, G, cfg.n_sel), -1, dtype=torch.long, device=dev)
        self.o = torch.zeros(B, HQ, dv, dtype=self.dtype, device=dev)  # attention output (triton impl)
        self.ar_cmp = torch.arange(self.ccap, device=dev)
        self.ar_blk = torch.arange(self.NB, device=dev)
        self.ar_sel = torch.arange(cfg.l_sel, device=dev)
        self.ar_w = torch.arange(cfg.w, device=dev)
        self.ar_l = torch.arange(cfg.l, device=dev)
        self.cos, self.sin = rope_table(self.cap, dk, module.rope_base, self.dtype, dev)
        self.refresh()
        self._graph = None
        self._tri = None
        if impl in TRITON_IMPLS:
            from nsa_core.decode import kernels as _decode_triton

            self._tri = _decode_triton.Workspace(self, chunk=chunk, warps=warps,
                                                 split_chunk=chunk if impl == "split" else None, tune=tune)

    def refresh(self) -> None:
        """Re-read the module's projection weights (fused into one GEMM for the step)."""
        m = self.m
        with torch.no_grad():
            w = torch.cat([m.q_proj.weight, m.k_cmp_proj.weight, m.k_sel_proj.weight, m.k_win_proj.weight,
                           m.v_cmp_proj.weight, m.v_sel_proj.weight, m.v_win_proj.weight], dim=0)
            self.w_cat = w.to(self.dtype).contiguous()

    # ---- pieces ------------------------------------------------------------------------------
    @torch.no_grad()
    def project(self, x: torch.Tensor):
        """x [B, 1, dim] at position pos -> q [B, HQ, dk], kc, vc, ks, vs, kw, vw [B, G, D], gates [B, HQ, 3]."""
        B, G, HQ, dk, dv = self.B, self.G, self.HQ, self.dk, self.dv
        xb = x[:, 0]
        hcat = xb @ self.w_cat.t()
        nqk = (HQ + 3 * G) * dk
        qk = hcat[:, :nqk].view(B, HQ + 3 * G, dk)
        half = dk // 2
        p1 = self.pos.view(1)
        cos, sin = self.cos.index_select(0, p1), self.sin.index_select(0, p1)  # [1, half]
        x1, x2 = qk[..., :half], qk[..., half:]
        qk = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
        v = hcat[:, nqk:].view(B, 3 * G, dv)
        q, kc, ks, kw = qk[:, :HQ], qk[:, HQ:HQ + G], qk[:, HQ + G:HQ + 2 * G], qk[:, HQ + 2 * G:]
        vc, vs, vw = v[:, :G], v[:, G:2 * G], v[:, 2 * G:]
        gates = torch.sigmoid(self.m.gate(xb)).view(B, HQ, 3)
        return q, kc, vc, ks, vs, kw, vw, gates

    @torch.no_grad()
    def append(self, kc, vc, ks, vs, kw, vw) -> None:
        """Write token pos into every cache; masked write of the compressed token that completes."""
        with _scope("shared"):
            if self._tri is not None:
                return self._tri.append(kc, vc, ks, vs, kw, vw)
            self._append_torch(kc, vc, ks, vs, kw, vw)

    def _append_torch(self, kc, vc, ks, vs, kw, vw) -> None:
        c, cfg = self.cache, self.cfg
        p1 = self.pos.view(1)
        rows = c.sel_rows(p1).view(-1)  # [B*G]: row t of each (b, g), dense or paged
        c.K_sel.view(-1, self.dk).index_copy_(0, rows, ks.reshape(-1, self.dk))
        c.V_sel.view(-1, self.dv).index_copy_(0, rows, vs.reshape(-1, self.dv))
        sw = p1 % cfg.w
        c.K_win.index_copy_(2, sw, kw[:, :, None])
        c.V_win.index_copy_(2, sw, vw[:, :, None])
        sl = p1 % cfg.l
        c.K_raw.index_copy_(2, sl, kc[:, :, None])
        c.V_raw.index_copy_(2, sl, vc[:, :, None])
        self._compress()

    def _compress(self) -> None:
        """Masked write of compressed row (pos+1-l)//d from the raw ring (tokens pos-l+1..pos)."""
        c, cfg, m = self.cache, self.cfg, self.m
        pos = self.pos
        order = (pos + 1 + self.ar_l) % cfg.l  # slots of tokens pos-l+1 .. pos
        emit = (pos + 1 >= cfg.l) & ((pos + 1 - cfg.l) % cfg.d == 0)
        ci = ((pos + 1 - cfg.l).clamp_min(0) // cfg.d).view(1)
        for raw, dst, phi in ((c.K_raw, c.K_cmp, m.phi_k), (c.V_raw, c.V_cmp, m.phi_v)):
            blk = raw.index_select(2, order)  # [B, G, l, D]
            new = blk.mean(2) if phi is None else phi(blk).to(self.dtype)
            old = dst.index_select(2, ci)[:, :, 0]
            dst.index_copy_(2, ci, torch.where(emit, new, old)[:, :, None])

    def _probs(self, q4, K, valid):
        """q4 [B, G, h, dk]; K [B, G, N, dk]; valid bool broadcastable to [B, G, 1, N]
        -> softmax probabilities [B, G, h, N] (acc dtype; 0 where masked; a row with nothing
        visible is all 0, never NaN)."""
        s = torch.matmul(q4, K.transpose(-1, -2)).to(self.acc) * self.scale
        s = s.masked_fill(~valid, float("-inf"))
        mx = s.amax(-1, keepdim=True)
        mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
        p = torch.exp(s - mx)
        return p / p.sum(-1, keepdim=True).clamp_min(1e-30)

    def _attend(self, q4, K, V, valid):
        """-> o [B, G, h, dv] (acc dtype), probabilities [B, G, h, N]."""
        p = self._probs(q4, K, valid)
        return torch.matmul(p.to(V.dtype), V).to(self.acc), p

    def _cmp_valid(self):
        cfg, s = self.cfg, self.pos + 1
        nvis = torch.where(s >= cfg.l, (s - cfg.l) // cfg.d + 1, torch.zeros_like(s))
        return self.ar_cmp < nvis

    @torch.no_grad()
    def cmp(self, q: torch.Tensor, *, with_probs: bool = False):
        """Compressed branch: o_cmp [B, G, h, dv] (acc dtype) (and the probabilities)."""
        c = self.cache
        o, p = self._attend(q.view(self.B, self.G, self.h, self.dk), c.K_cmp, c.V_cmp, self._cmp_valid())
        return (o, p) if with_probs else o

    def _block_scores(self, p: torch.Tensor) -> torch.Tensor:
        """p [B, G, h, ccap] compressed probabilities -> per-group block scores [B, G, NB] (Eqs. 9-10)."""
        cfg = self.cfg
        a, b = cfg.l_sel // cfg.d, cfg.l // cfg.d
        P = p.sum(2)  # Eq. 10: sum over the heads of the group
        U = self.NB * a  # d-units of the capacity
        Pp = torch.nn.functional.pad(P, (b - 1, U - self.ccap))
        unit = Pp.unfold(-1, b, 1).sum(-1) if b > 1 else Pp  # [B, G, U]: sum_{n<b} P[u - n]
        return unit.view(self.B, self.G, self.NB, a).sum(-1)

    def _topn(self, sc: torch.Tensor) -> torch.Tensor:
        """Eq. 11 over all NB blocks with masks -> ids [B, G, n_sel] (-1 = unused slot)."""
        cfg = self.cfg
        cur = self.pos // cfg.l_sel
        j = self.ar_blk
        cand = j <= cur
        forced = cand & ((j == 0) | (j == cur) | (j == cur - 1))
        sc = torch.where(forced, torch.full_like(sc, float("inf")), sc)
        sc = torch.where(cand, sc, torch.full_like(sc, float("-inf")))
        vals, idx = sc.topk(self.n, dim=-1)
        idx = torch.where(vals > float("-inf"), idx, torch.full_like(idx, -1))
        if self.n < cfg.n_sel:
            idx = torch.cat([idx, idx.new_full((self.B, self.G, cfg.n_sel - self.n), -1)], dim=-1)
        return idx

    @torch.no_grad()
    def select(self, q: torch.Tensor, p: torch.Tensor | None = None) -> torch.Tensor:
        """Selection scores + top-n for the query: block ids [B, G, n_sel] (-1 = unused), into self.blk."""
        if p is None:
            p = self._probs(q.view(self.B, self.G, self.h, self.dk), self.cache.K_cmp, self._cmp_valid())
        self.blk.copy_(self._topn(self._block_scores(p)))
        return self.blk

    @torch.no_grad()
    def slc(self, q: torch.Tensor, blk: torch.Tensor) -> torch.Tensor:
        """Selected branch over the blocks blk [B, G, n] -> o_slc [B, G, h, dv] (acc dtype)."""
        c, cfg = self.cache, self.cfg
        B, G, ls = self.B, self.G, cfg.l_sel
        n = blk.shape[-1]
        tok = blk[..., None] * ls + self.ar_sel  # [B, G, n, ls]
        rows = c.sel_rows(tok.clamp_min(0).view(B, G, n * ls)).view(-1)  # dense or paged
        K = c.K_sel.view(-1, self.dk).index_select(0, rows).view(B, G, n * ls, self.dk)
        V = c.V_sel.view(-1, self.dv).index_select(0, rows).view(B, G, n * ls, self.dv)
        valid = ((blk[..., None] >= 0) & (tok <= self.pos)).view(B, G, 1, n * ls)
        o, _ = self._attend(q.view(B, G, self.h, self.dk), K, V, valid)
        return o

    @torch.no_grad()
    def win(self, q: torch.Tensor) -> torch.Tensor:
        """Window branch over the ring (slots < pos + 1) -> o_win [B, G, h, dv] (acc dtype)."""
        c = self.cache
        o, _ = self._attend(q.view(self.B, self.G, self.h, self.dk), c.K_win, c.V_win, self.ar_w <= self.pos)
        return o

    def combine(self, o_cmp, o_slc, o_win, gates) -> torch.Tensor:
        """Eq. 5: gated sum (None = branch left out) -> o [B, HQ, dv] in the cache dtype."""
        g = gates.view(self.B, self.G, self.h, 3).to(self.acc)
        o = None
        for i, ob in enumerate((o_cmp, o_slc, o_win)):
            if ob is not None:
                term = g[..., i:i + 1] * ob
                o = term if o is None else o + term
        if o is None:
            raise ValueError("combine: no branch selected")
        return o.to(self.dtype).view(self.B, self.HQ, self.dv)

    @torch.no_grad()
    def branches(self, q, gates, *, cmp: bool = True, slc: bool = True, win: bool = True) -> torch.Tensor:
        """Gated sum of the chosen branches (all three: Eq. 5) for q [B, HQ, dk] -> o [B, HQ, dv].

        With one branch only, this is that branch alone (selection includes its scores and top-n),
        which is how the benchmark times branches in isolation.
        """
        if self._tri is not None:
            return self._tri.branches(q, gates, self.o, cmp=cmp, slc=slc, win=win)
        o_cmp = o_slc = o_win = p = None
        if cmp:
            with _scope("cmp"):  # the probabilities are shared with the selection scores: counted here
                o_cmp, p = self.cmp(q, with_probs=True)
        if slc:
            with _scope("sel"):
                o_slc = self.slc(q, self.select(q, p))
        if win:
            with _scope("win"):
                o_win = self.win(q)
        with _scope("shared"):
            return self.combine(o_cmp, o_slc, o_win, gates)

    @torch.no_grad()
    def attn(self, q, kc, vc, ks, vs, kw, vw, gates) -> torch.Tensor:
        """The attention part of a step (append + three branches + gates) -> o [B, HQ, dv]."""
        if self.impl in ("fused", "split"):
            with _scope("shared"):
                return getattr(self._tri, self.impl)(q, kc, vc, ks, vs, kw, vw, gates, self.o)
        if self.impl == "triton":  # five launches (the append inside the compressed pass) or six
            return self._tri.attn(q, kc, vc, ks, vs, kw, vw, gates, self.o)
        self.append(kc, vc, ks, vs, kw, vw)
        return self.branches(q, gates)

    @torch.no_grad()
    def run_step(self) -> torch.Tensor:
        """The whole step on the buffers: y = out(attn(project(x))) at position pos, into self.y."""
        o = self.attn(*self.project(self.x))
        self.y.copy_(self.m.o_proj(o.reshape(self.B, 1, self.HQ * self.dv)))
        return self.y

    # ---- eager convenience + graphs ---------------------------------------------------------
    def capture(self, warmup: int = 2) -> None:
        """Capture run_step in a CUDA graph (replayed by step()).

        Warm-up and capture really run the step, so they run it at position cache.length: the
        slot the next real step overwrites (its K_sel row, ring slots and, when a block completes
        there, its compressed row are all rewritten by that step), so the cache is unchanged."""
        self._prepare_capture()
        self._graph = capture_graph(self.run_step, warmup=warmup)

    def _prepare_capture(self) -> None:
        if self.cache.length >= self.cap:
            raise ValueError(f"StaticDecoder.capture: cache is full (capacity {self.cap})")
        self.pos.fill_(self.cache.length)

    @torch.no_grad()
    def step(self, x: torch.Tensor) -> torch.Tensor:
        """Decode one token x [B, 1, dim] at position cache.length -> y [B, 1, dim] (a view of self.y)."""
        c = self.cache
        if tuple(x.shape) != tuple(self.x.shape):
            raise ValueError(f"StaticDecoder.step: x must be {tuple(self.x.shape)}, got {tuple(x.shape)}")
        if c.length + 1 > self.cap:
            raise ValueError(f"StaticDecoder: cache is full (capacity {self.cap}); allocate a larger one "
                             "(NSAAttention.forward(..., max_len=) or new_cache)")
        self.x.copy_(x)
        self.pos.fill_(c.length)
        if self._graph is not None:
            self._graph.replay()
        else:
            self.run_step()
        c.length += 1
        c.reads = read_counts(self.pos + 1, self.blk, None, self.cfg)
        c.reads_per_step = [c.reads]
        c.last_selection = self.blk.clone()
        return self.y


def capture_graph(fn, warmup: int = 2):
    """Warm ``fn`` up on a side stream, then capture it in a torch.cuda.CUDAGraph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g
