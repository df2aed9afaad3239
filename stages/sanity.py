"""Stage ``sanity``: every NSA branch and the NSAAttention module run forward + backward on this
run's device, through the backends the router picks here.

Writes routing.json (backend per branch and why, from ``nsa_core.routing.decide``), sanity.out
(a table for people) and sanity.json (schema_version 1). Checks, on fresh random inputs (seed
``--seed``, else a fresh one per run; recorded in sanity.json / sanity.out with the command that
replays it, which is also printed):

- per branch (cmp, slc, win) with the routed backend: output shape, finite; forward and the
  input gradients within the DESIGN §7 tolerance of a float64 reference; causality (changing
  keys/values after position t0 leaves outputs up to t0 unchanged);
- selection: block_idx/block_count structure (ascending, -1 padded, block 0 and the local
  blocks forced, nothing in the future), GQA consistency (permuting the heads of a group does
  not change its blocks; another group's queries do not affect them);
- NSAAttention: forward + backward, right shapes, finite output and parameter gradients, causal;
- every part runs on copies of its inputs (the reference reads the originals): one that wrote into an
  input is a failed check ``<part> inputs`` naming it.
Shapes: tiny on the quick profile (CPU / CI), moderate on full (GPU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nsa_runner.artifacts import now_iso, write_json, write_text
from nsa_runner.impls import (
    BadOutput,
    ImplError,
    adapter_code,
    adapter_failed,
    describe_failure,
    plain_tensor,
    text_of,
    type_name,
)
from nsa_runner.stage import Stage, StageResult, Status

from . import _parity, _seed


@dataclass(frozen=True)
class Shape:
    B: int
    T: int
    HQ: int
    G: int
    dk: int
    dv: int
    dim: int
    cfg: dict

    @property
    def h(self) -> int:
        return self.HQ // self.G


# quick: T spans 6 selection blocks with n_sel=4, so top-n really chooses; w < T so the window slides
SHAPES = {
    "quick": Shape(B=1, T=96, HQ=4, G=2, dk=16, dv=16, dim=32,
                   cfg=dict(l=8, d=4, l_sel=16, n_sel=4, w=32)),
    "full": Shape(B=2, T=2048, HQ=16, G=2, dk=64, dv=64, dim=256,
                  cfg=dict(l=32, d=16, l_sel=64, n_sel=16, w=512)),
}


class _Checks:
    def __init__(self):
        self.rows: list[dict] = []
        self._names: set[str] = set()

    def add(self, name: str, ok: bool, detail: str, echo: bool = True, **extra) -> bool:
        """``echo``: the check's line in the log (an adapter's own process printed its lines there itself)."""
        ok = bool(ok)
        base, n = name, 1
        while name in self._names:  # names are unique in sanity.json: its readers refuse two of one name
            n += 1
            name = f"{base} #{n}"
        self._names.add(name)
        self.rows.append({"check": name, "ok": ok, "detail": detail, **extra})
        if echo:
            print(f"[{'ok' if ok else 'FAIL'}] {name}: {detail}", flush=True)
        return ok

    def guard(self, name: str, fn, adapter: str | None = None) -> None:
        """Run fn(); a failure of the code under test is a failed check with its message: any
        BaseException an adapter raises (SystemExit, GeneratorExit, its own KeyboardInterrupt: round
        13 B5), its text never trusted (a ``__str__`` that raises). A real SIGINT still stops the stage.
        ``adapter``: the implementation whose code fn runs (named first in ``describe_failure``'s note)."""
        try:
            with adapter_code():
                fn()
        except BaseException as e:  # noqa: BLE001
            adapter_failed(e)
            self.add(name, False, f"raised {describe_failure(e, adapter=adapter)}")


def _rand(gen, *shape, device, dtype, requires_grad=False):
    import torch

    t = torch.randn(*shape, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
    return t.requires_grad_(requires_grad)


def _branch_inputs(branch: str, s: Shape, gen, device, dtype):
    q = _rand(gen, s.B, s.T, s.HQ, s.dk, device=device, dtype=dtype)
    k = _rand(gen, s.B, s.T, s.G, s.dk, device=device, dtype=dtype)
    v = _rand(gen, s.B, s.T, s.G, s.dv, device=device, dtype=dtype)
    return q, k, v


def _run_branch(F, branch, q, k, v, sel, cfg, backend):
    if branch == "cmp":
        return F.compressed_attention(q, k, v, cfg, backend)
    if branch == "slc":
        return F.selection_attention(q, k, v, sel[0], sel[1], cfg, backend)
    return F.sliding_attention(q, k, v, cfg, backend)


def _check_branch(c: _Checks, F, testing, branch, backend, s: Shape, cfg, gen, device, sel_q, sel_k,
                  label: str | None = None, tf32: bool | None = None):
    import torch

    dtype = torch.bfloat16 if backend == "flash" else torch.float32
    if tf32 is None:
        tf32 = device == "cuda" and backend in ("triton", "flash") and dtype == torch.float32
    q, k, v = _branch_inputs(branch, s, gen, device, dtype)
    # the selection every slc run uses: from independent queries / raw compression keys
    sel = F.select_blocks(sel_q.to(dtype), sel_k.to(dtype), cfg) if branch == "slc" else None
    name = label or f"{branch}/{backend}"
    # the part runs on copies of its own, the reference on the originals (round 16 B5): one that wrote
    # into an input (q, k, v, the selection, do in its backward) is a failed check naming it
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    sel_part = None if sel is None else _parity.handed(*sel)
    o = _run_branch(F, branch, *leaves, sel_part, cfg, backend)
    want = (s.B, s.T, s.HQ, s.dv)
    if not c.add(f"{name} shape", tuple(o.shape) == want, f"{tuple(o.shape)} (want {want})"):
        _inputs_kept(c, name, _held(q, k, v, sel, leaves, sel_part))
        return
    c.add(f"{name} finite", bool(torch.isfinite(o).all()), f"{int((~torch.isfinite(o)).sum())} non-finite values")
    do = _rand(gen, *o.shape, device=device, dtype=dtype)
    do_part = do.clone()
    o.backward(do_part)
    kept = _inputs_kept(c, name, _held(q, k, v, sel, leaves, sel_part) + [("do", do, do_part)])
    refs = [t.detach().to(torch.float64).requires_grad_(True) for t in (q, k, v)]
    o_ref = _run_branch(F, branch, *refs, sel, cfg, "reference")
    o_ref.backward(do.to(torch.float64))
    cmp = testing.compare(o, o_ref, dtype, tf32=tf32)
    c.add(f"{name} forward vs fp64 reference", cmp.ok, str(cmp), rel_err=cmp.rel_err, tol=cmp.tol)
    for label, got, ref in zip(("dq", "dk", "dv"), leaves, refs, strict=True):
        if got.grad is None:
            c.add(f"{name} {label}", False, "no gradient reached this input")
            continue
        grad = plain_tensor(got.grad, f"{name} {label}", view=True)  # an implementation's backward's (B-R3)
        g = testing.compare(grad, ref.grad, dtype, tf32=tf32)
        c.add(f"{name} {label} vs fp64 reference", g.ok and tuple(grad.shape) == tuple(got.shape),
              f"{g} shape {tuple(grad.shape)}", rel_err=g.rel_err, tol=g.tol)
    # causality: change keys/values after t0; outputs up to t0 must not move
    t0 = s.T // 2 - 1
    with torch.no_grad():
        k2, v2 = k.detach().clone(), v.detach().clone()
        k2[:, t0 + 1:] = _rand(gen, s.B, s.T - t0 - 1, s.G, s.dk, device=device, dtype=dtype)
        v2[:, t0 + 1:] = _rand(gen, s.B, s.T - t0 - 1, s.G, s.dv, device=device, dtype=dtype)
        runs = []
        for kk, vv in ((k.detach(), v.detach()), (k2, v2)):
            mine = _parity.handed(q.detach(), kk, vv)
            mine_sel = None if sel is None else _parity.handed(*sel)
            runs.append(_run_branch(F, branch, *mine, mine_sel, cfg, backend))
            if kept:  # one row naming what it wrote, not one per run
                kept = _inputs_kept(c, name, _held(q, kk, vv, sel, mine, mine_sel))
        o1, o2 = runs
        past = float((o1[:, : t0 + 1] - o2[:, : t0 + 1]).abs().max())
        future = float((o1[:, t0 + 1:] - o2[:, t0 + 1:]).abs().max())
    scale = float(o1.abs().max()) or 1.0
    c.add(f"{name} causal", past <= 1e-6 * scale and future > 0,
          f"t0={t0}: max change at t<=t0 {past:.1e}, after t0 {future:.1e} (must be 0 / > 0)")


def _held(q, k, v, sel, mine, mine_sel) -> list:
    """(name, input, the part's copy) of a branch call's inputs."""
    pairs = list(zip(("q", "k", "v"), (q, k, v), mine, strict=True))
    if sel is not None:
        pairs += list(zip(("block_idx", "block_count"), sel, mine_sel, strict=True))
    return pairs


def _inputs_kept(c: _Checks, name: str, pairs, who: str | None = None) -> bool:
    """False, after a failed check ``<name> inputs`` naming them, when the part changed any of the inputs it
    was handed a copy of (round 16 B5: before, the reference read what it left there)."""
    wrote = _parity.written(pairs)
    if wrote:
        c.add(f"{name} inputs", False, _parity.written_text(who or name, wrote))
    return not wrote


def _check_selection(c: _Checks, F, s: Shape, cfg, gen, device):
    import torch

    q = _rand(gen, s.B, s.T, s.HQ, s.dk, device=device, dtype=torch.float32)
    k = _rand(gen, s.B, s.T, s.G, s.dk, device=device, dtype=torch.float32)
    idx, cnt = F.select_blocks(q, k, cfg)
    want = (s.B, s.T, s.G, cfg.n_sel)
    c.add("select shape/dtype", tuple(idx.shape) == want and tuple(cnt.shape) == want[:3]
          and idx.dtype == torch.int32 and cnt.dtype == torch.int32,
          f"block_idx {tuple(idx.shape)} {idx.dtype}, block_count {tuple(cnt.shape)} {cnt.dtype} (want {want} int32)")
    t = torch.arange(s.T, device=device)
    cur = (t // cfg.l_sel)[None, :, None]  # [1, T, 1]
    exp_cnt = torch.clamp(cur + 1, max=cfg.n_sel)
    slot = torch.arange(cfg.n_sel, device=device)
    valid = slot[None, None, None, :] < cnt[..., None]
    ids = idx.long()
    problems = []
    if not torch.equal(cnt.long(), exp_cnt.expand_as(cnt)):
        problems.append("block_count != min(n, t//l_sel + 1)")
    if bool((ids[~valid] != -1).any()):
        problems.append("padding after block_count is not -1")
    big = torch.where(valid, ids, torch.full_like(ids, 1 << 40))
    if bool((big[..., 1:] <= big[..., :-1]).logical_and(valid[..., 1:]).any()):
        problems.append("chosen ids not strictly ascending")
    if bool(((ids > cur[..., None]) & valid).any()):
        problems.append("a block after t's own block is selected (future)")
    has = lambda j: ((ids == j[..., None]) & valid).any(-1)  # noqa: E731
    if not bool(has(torch.zeros_like(cur).expand_as(cnt)).all()):
        problems.append("block 0 not always selected")
    if not bool(has(cur.expand_as(cnt)).all()):
        problems.append("current block t//l_sel not always selected")
    prev = (cur - 1).expand_as(cnt)
    if not bool((has(prev) | (prev < 0)).all()):
        problems.append("previous block t//l_sel-1 not always selected")
    c.add("select structure", not problems, "; ".join(problems) or
          f"ascending, -1 padded, forced blocks present, causal, counts min(n, t//l'+1) (n={cfg.n_sel})")
    # GQA: permuting the heads within each group must not change the group's blocks,
    # and changing another group's queries must not change them either. In float64: the head
    # sum of Eq. 10 in another order moves fp32 scores by ~1e-7, enough to flip a near-tie
    # (seen on the H100: 8 of 1M entries), which is rounding, not a GQA defect.
    q64, k64 = q.double(), k.double()
    idx64, _ = F.select_blocks(q64, k64, cfg)
    perm = torch.cat([g * s.h + torch.randperm(s.h, generator=gen).to(device) for g in range(s.G)])
    idx_p, _ = F.select_blocks(q64[:, :, perm], k64, cfg)
    c.add("select GQA: head order within a group", torch.equal(idx_p, idx64),
          "identical block_idx (float64) after permuting heads within each group" if torch.equal(idx_p, idx64)
          else f"{int((idx_p != idx64).sum())} entries changed")
    if s.G > 1:
        q2 = q64.clone()
        q2[:, :, s.h:] = _rand(gen, s.B, s.T, s.HQ - s.h, s.dk, device=device, dtype=torch.float32).double()
        idx2, _ = F.select_blocks(q2, k64, cfg)
        same0 = torch.equal(idx2[:, :, 0], idx64[:, :, 0])
        changed = not torch.equal(idx2[:, :, 1:], idx64[:, :, 1:])
        c.add("select GQA: groups independent", same0 and changed,
              f"group 0 unchanged={same0} when other groups' queries change (they changed={changed})")


# ---- implementations under test (--impl; nsa_runner.impls) ------------------------------------
# The shared-K/V case every implementation runs (its nsa_attention and select parts): one K/V for the
# three branches and l = d = l' (Eq. 9 is the identity), the semantics an implementation such as
# fla's parallel_nsa shares with DESIGN §2; the window gate is 0 (fla's window needs flash-attn).
# T spans more selection blocks than n, so top-n really chooses.
SHARED = {
    "quick": Shape(B=1, T=96, HQ=16, G=1, dk=16, dv=16, dim=0, cfg=dict(l=16, d=16, l_sel=16, n_sel=4, w=16)),
    "full": Shape(B=1, T=2048, HQ=16, G=1, dk=64, dv=64, dim=0, cfg=dict(l=64, d=64, l_sel=64, n_sel=16, w=512)),
}
BRANCH_PART = {"cmp": "compressed_attention", "slc": "selection_attention", "win": "sliding_attention"}


class _ImplF:
    """``nsa_core.functional``-shaped view of an implementation for :func:`_check_branch`: backend
    "reference" is nsa_core's float64 reference; any other backend is the implementation's part.
    ``select_blocks`` is always OURS: the slc branch is checked given our block indices."""

    def __init__(self, impl):
        from nsa_core import functional as F

        self.impl, self.F = impl, F

    def select_blocks(self, q, k, cfg):
        return self.F.select_blocks(q, k, cfg)

    def _out(self, part: str, o, q):
        """What the part returned, a plain tensor (its autograd history kept) in q's dtype (round 17 a2): made
        inside the check's guard, nothing of an adapter's Tensor subclass runs after it (round 15 B-R3)."""
        return plain_tensor(o, f"{self.impl.name}'s {part} output", view=True, dtype=q.dtype)

    def compressed_attention(self, q, k, v, cfg, backend):
        if backend == "reference":
            return self.F.compressed_attention(q, k, v, cfg, "reference")
        return self._out("compressed_attention", self.impl.parts["compressed_attention"](q, k, v, cfg), q)

    def selection_attention(self, q, k, v, idx, cnt, cfg, backend):
        if backend == "reference":
            return self.F.selection_attention(q, k, v, idx, cnt, cfg, "reference")
        return self._out("selection_attention", self.impl.parts["selection_attention"](q, k, v, idx, cnt, cfg), q)

    def sliding_attention(self, q, k, v, cfg, backend):
        if backend == "reference":
            return self.F.sliding_attention(q, k, v, cfg, "reference")
        return self._out("sliding_attention", self.impl.parts["sliding_attention"](q, k, v, cfg), q)


def _impl_case(s: Shape, cfg, device: str, dtype: str, **flags):
    from nsa_runner.impls import Case

    return Case(B=s.B, T=s.T, HQ=s.HQ, G=s.G, dk=s.dk, dv=s.dv, dtype=dtype, device=device, cfg=cfg, **flags)


def _check_impl_branches(c: _Checks, skips: list, impl, testing, s: Shape, cfg, gen, device, sel_q, sel_k):
    """The branch checks of nsa_core's routed backends, on an implementation's parts (same shape)."""
    F = _ImplF(impl)
    for branch, part in BRANCH_PART.items():
        if part not in impl.parts:
            continue
        try:
            why = impl.excluded(_impl_case(s, cfg, device, "fp32"), part)
        except ImplError as e:  # its constraints raised: its check fails, the others still run (round 12 B5)
            c.add(f"{impl.name} {branch}", False, str(e))
            continue
        if why:
            skips.append({"check": f"{impl.name} {branch}", "reason": why})
            print(f"[SKIP] {impl.name} {branch}: {why}", flush=True)
            continue
        c.guard(f"{impl.name} {branch}", lambda b=branch: _check_branch(
            c, F, testing, b, impl.name, s, cfg, gen, device, sel_q, sel_k, label=f"{impl.name} {b}",
            tf32=device == "cuda"), adapter=impl.name)


def _check_impl_shared(c: _Checks, skips: list, impl, testing, profile: str, gen, device):
    """nsa_attention and select of one implementation on the shared-K/V case vs the float64 reference."""
    import torch

    from nsa_core import NSAConfig
    from nsa_core import functional as F

    s = SHARED[profile]
    cfg = NSAConfig(**s.cfg)
    dtype_name = "bf16" if device == "cuda" else "fp32"
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    q = _rand(gen, s.B, s.T, s.HQ, s.dk, device=device, dtype=dtype)
    k = _rand(gen, s.B, s.T, s.G, s.dk, device=device, dtype=dtype)
    v = _rand(gen, s.B, s.T, s.G, s.dv, device=device, dtype=dtype)
    case = _impl_case(s, cfg, device, dtype_name, shared_kv=True, window=False)
    shape = f"B={s.B} T={s.T} HQ={s.HQ} G={s.G} dk={s.dk} dv={s.dv} {dtype_name} l=d=l'={cfg.l_sel} n={cfg.n_sel}"
    if "nsa_attention" in impl.parts:
        try:  # its constraints raised: that check fails naming it, the others still run (round 12 B5)
            why = impl.excluded(case, "nsa_attention")
        except ImplError as e:
            c.add(f"{impl.name} nsa_attention (shared K/V)", False, str(e))
        else:
            if why:
                skips.append({"check": f"{impl.name} nsa_attention (shared K/V)", "reason": why})
            else:
                c.guard(f"{impl.name} nsa_attention (shared K/V)",
                        lambda: _nsa_vs_reference(c, impl, testing, F, q, k, v, cfg, gen, device, dtype, shape),
                        adapter=impl.name)
    if "select" in impl.parts:
        try:
            why = impl.excluded(case, "select")
        except ImplError as e:
            c.add(f"{impl.name} select", False, str(e))
        else:
            if why:
                skips.append({"check": f"{impl.name} select (shared K/V case)", "reason": why})
            else:
                c.guard(f"{impl.name} select", lambda: _select_vs_reference(c, impl, F, q, k, cfg, shape),
                        adapter=impl.name)


def _nsa_vs_reference(c: _Checks, impl, testing, F, q, k, v, cfg, gen, device, dtype, shape):
    import torch

    from .selection_map import stored_mean

    B, T, HQ, _ = q.shape
    gates = torch.rand(B, T, HQ, 3, generator=gen).to(device=device, dtype=dtype)
    gates[..., 2] = 0  # window branch off (see SHARED)
    name = f"{impl.name} nsa_attention (shared K/V, window gate 0)"
    who = f"{impl.name}'s nsa_attention"
    # copies of its own (round 16 B5): the reference reads q, k, v, gates, do as they were made
    qq, kk, vv = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    (gates_part,) = _parity.handed(gates)
    held = [("q", q, qq), ("k", k, kk), ("v", v, vv), ("gates", gates, gates_part)]
    o = plain_tensor(impl.parts["nsa_attention"](qq, kk, vv, kk, vv, kk, vv, gates_part, cfg),
                     f"{impl.name}'s nsa_attention output", view=True, dtype=q.dtype)  # round 15 B-R3, 17 a2
    want = (B, T, HQ, v.shape[-1])
    if not c.add(f"{name} shape", tuple(o.shape) == want, f"{tuple(o.shape)} (want {want}) [{shape}]"):
        _inputs_kept(c, name, held, who)
        return
    do = _rand(gen, *o.shape, device=device, dtype=dtype)
    do_part = do.clone()
    o.backward(do_part)
    _inputs_kept(c, name, held + [("do", do, do_part)], who)
    r = [x.detach().to(torch.float64).requires_grad_(True) for x in (q, k, v)]
    phi = stored_mean(dtype)  # compressed keys/values as a `dtype` pipeline holds them (see there)
    ref = F.nsa_attention(r[0], r[1], r[2], r[1], r[2], r[1], r[2], gates.to(torch.float64), cfg, "reference",
                          phi_k=phi, phi_v=phi)
    ref.backward(do.to(torch.float64))
    tf32 = device == "cuda" and dtype == torch.float32
    cmp = testing.compare(o, ref, dtype, tf32=tf32)
    c.add(f"{name} forward vs fp64 reference", cmp.ok, f"{cmp} [{shape}]", rel_err=cmp.rel_err, tol=cmp.tol)
    for label, got, want_ in zip(("dq", "dk", "dv"), (qq, kk, vv), r, strict=True):
        if got.grad is None:
            c.add(f"{name} {label}", False, "no gradient reached this input")
            continue
        g = testing.compare(plain_tensor(got.grad, f"{name} {label}", view=True), want_.grad, dtype, tf32=tf32)
        c.add(f"{name} {label} vs fp64 reference", g.ok, str(g), rel_err=g.rel_err, tol=g.tol)


def _select_vs_reference(c: _Checks, impl, F, q, k, cfg, shape):
    """Structure (selection-map's checks) and the same blocks as the float64 reference, a differing
    (t, group) row accepted only as a near-tie (DESIGN §7: the two sets' reference scores within 1e-5)."""
    from .selection_map import against_reference, check_selection

    mine = _parity.handed(q, k)  # its own copies: the reference below reads the originals (round 16 B5)
    got = impl.parts["select"](*mine, cfg)
    _inputs_kept(c, f"{impl.name} select", zip(("q", "k_cmp"), (q, k), mine, strict=True), f"{impl.name}'s select")
    if type(got) not in (tuple, list) or len(got) != 2:
        raise BadOutput(f"{impl.name}'s select returned a {type_name(got)}, want (block_idx, block_count)")
    idx, cnt = (plain_tensor(x, f"{impl.name}'s select {w}", integer=True)  # round 15 B-R3
                for x, w in zip(got, ("block_idx", "block_count"), strict=True))
    rows = check_selection(idx, cnt, cfg)
    bad = [r for r in rows if not r["ok"]]
    c.add(f"{impl.name} select structure", not bad, "; ".join(f"{r['check']}: {r['detail']}" for r in bad)
          or f"ascending, -1 padded, forced blocks present, causal, counts min(n, t//l'+1) [{shape}]")
    if bad:
        return
    d = against_reference(idx, cnt, q, k, cfg, stored_dtype=q.dtype)
    c.add(f"{impl.name} select vs fp64 reference", d["ok"], f"{d['detail']} [{shape}]")


def _check_module(c: _Checks, NSAAttention, NSAConfig, s: Shape, cfg, gen, device, backends):
    import torch

    # torch's global generators seeded for the module's initial weights and put back after: the check runs in the
    # adapter guard, which named this stage's own seeding as an implementation's change (round 42 B42-2)
    devices = [torch.device(device).index or 0] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        _module_checks(c, NSAAttention, s, cfg, gen, device, backends)


def _module_checks(c: _Checks, NSAAttention, s: Shape, cfg, gen, device, backends):
    import torch

    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
    m = NSAAttention(s.dim, s.HQ, s.G, s.dk, s.dv, cfg, backend=backends).to(device)
    x = _rand(gen, s.B, s.T, s.dim, device=device, dtype=torch.float32, requires_grad=True)
    y, _cache = m(x)
    ok = c.add("module forward shape", tuple(y.shape) == (s.B, s.T, s.dim), f"y {tuple(y.shape)}")
    c.add("module forward finite", bool(torch.isfinite(y).all()), f"{int((~torch.isfinite(y)).sum())} non-finite")
    if not ok:
        return
    (y * _rand(gen, *y.shape, device=device, dtype=torch.float32)).sum().backward()
    missing = [n for n, p in m.named_parameters() if p.requires_grad and p.grad is None]
    bad = [n for n, p in m.named_parameters() if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
    zero = [n for n, p in m.named_parameters() if p.grad is not None and float(p.grad.abs().max()) == 0.0]
    n_params = sum(1 for _ in m.parameters())
    c.add("module backward", not missing and not bad and not zero and x.grad is not None
          and bool(torch.isfinite(x.grad).all()),
          f"{n_params} parameter tensors: no grad {missing or '-'}, non-finite {bad or '-'}, all-zero {zero or '-'}")
    t0 = s.T // 2 - 1
    with torch.no_grad():
        x2 = x.detach().clone()
        x2[:, t0 + 1:] = _rand(gen, s.B, s.T - t0 - 1, s.dim, device=device, dtype=torch.float32)
        y1, _ = m(x.detach())
        y2, _ = m(x2)
        past = float((y1[:, : t0 + 1] - y2[:, : t0 + 1]).abs().max())
    c.add("module causal", past <= 1e-6 * (float(y1.abs().max()) or 1.0),
          f"t0={t0}: max change of y at t<=t0 after changing x after t0: {past:.1e}")


def _render(doc: dict) -> str:
    s = doc["shape"]
    lines = [f"nsa-run sanity  run {doc['run_id']}  {doc['time']}",
             f"device {doc['device']}  profile {doc['profile']}  seed {doc['seed']}  (replay: {doc['replay']})",
             f"shape B={s['B']} T={s['T']} HQ={s['HQ']} G={s['G']} dk={s['dk']} dv={s['dv']} dim={s['dim']}  "
             f"cfg {doc['cfg']}", "", "routing:"]
    lines += [f"  {b:<4} {r['backend']:<9} {r['reason']}" for b, r in doc["routing"].items()]
    lines += ["", "checks:"]
    lines += [f"  [{'ok' if r['ok'] else 'FAIL':<4}] {r['check']:<40} {r['detail']}" for r in doc["checks"]]
    lines += [f"  [SKIP] {r['check']:<40} {r['reason']}" for r in doc.get("skipped", [])]
    n_fail = sum(not r["ok"] for r in doc["checks"])
    lines += ["", f"{len(doc['checks']) - n_fail} ok, {n_fail} failed, {len(doc.get('skipped', []))} skipped"]
    return "\n".join(lines) + "\n"


def _impl_checks(c: _Checks, skips: list, entry, testing, s: Shape, cfg, gen, device, sel_q, sel_k, profile: str):
    """One implementation's checks: its branch parts on the stage's shape (not nsa_core's: its routed backends ran
    above), its nsa_attention and select on the shared-K/V case."""
    if entry.impl is None:
        c.add(f"{entry.name} adapter", False, f"broken adapter: {entry.error}")
        return
    if entry.impl.note:
        print(f"# {entry.name}: {text_of(entry.impl.note, 2000)}", flush=True)
    if entry.name != "nsa_core":
        _check_impl_branches(c, skips, entry.impl, testing, s, cfg, gen, device, sel_q, sel_k)
    _check_impl_shared(c, skips, entry.impl, testing, profile, gen, device)


def _selection_inputs(s: Shape, gen, device):
    """The queries and keys every slc check selects blocks from: the generator's first draws (the stage's and an
    adapter's own process draw the same ones from the same seed)."""
    import torch

    return (_rand(gen, s.B, s.T, s.HQ, s.dk, device=device, dtype=torch.float32),
            _rand(gen, s.B, s.T, s.G, s.dk, device=device, dtype=torch.float32))


def checks_in_host(job: dict, out_path: str) -> None:
    """(In a plugin adapter's own process: ``stages._impl_host``.) Its checks, on inputs drawn from the stage's seed,
    written to ``out_path`` as JSON (whole, then renamed)."""
    import json
    import os

    import torch

    from nsa_core import NSAConfig, testing

    s = SHAPES[job["profile"]]
    gen = torch.Generator(device="cpu").manual_seed(int(job["seed"]))
    sel_q, sel_k = _selection_inputs(s, gen, job["device"])
    c, skips = _Checks(), []
    _impl_checks(c, skips, _parity.load_impl(job["name"]), testing, s, NSAConfig(**s.cfg), gen, job["device"],
                 sel_q, sel_k, job["profile"])
    with open(out_path + ".part", "w") as f:
        json.dump({"checks": c.rows, "skipped": skips}, f)
    os.replace(out_path + ".part", out_path)


CHECK_NAME_CHARS, CHECK_DETAIL_CHARS = 200, 2000  # an adapter's check from its own process: its name, its detail


def _own_name(text, name: str) -> bool:
    """A check's name as this stage makes them for implementation ``name``: its own (``name`` first), one printable
    line (round 50 B50a-3: a newline in it wrote a line "[ok] nsa_core fwd" of its making into sanity.out), short."""
    return (isinstance(text, str) and text.startswith(f"{name} ") and text.isprintable()
            and len(text) <= CHECK_NAME_CHARS)


def _plain_number(v) -> bool:
    """A finite number a float holds (round 50 B50a-1: a NaN, an infinity or 10**400 from an adapter's process made
    sanity ERROR with a traceback, nsa_core's checks lost), or none."""
    if v is None:
        return True
    if type(v) not in (int, float):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def _own_check(r, name: str) -> bool:
    """A check as ``_Checks.add`` makes it, named for implementation ``name`` (its process cannot report checks of
    nsa_core's or another's): a name of its own, a text detail, a bool verdict, finite numbers (or none) in the rest."""
    return (isinstance(r, dict) and _own_name(r.get("check"), name) and type(r.get("ok")) is bool
            and isinstance(r.get("detail"), str)
            and all(isinstance(k, str) and k.isidentifier() and _plain_number(v)
                    for k, v in r.items() if k not in ("check", "ok", "detail")))


def _read_checks(path: str, name: str) -> dict:
    """The checks an adapter's process wrote, checked (``_own_check``); their details and skip reasons one line each,
    control characters written out, clipped (round 50 B50a-2: a 40 MiB detail made the stage's record too large, its
    verdict lost). ValueError when they are not its own plain checks."""
    import json

    from nsa_runner._text import clip, written_out

    with open(path, "rb") as f:
        data = json.loads(f.read(64 << 20))
    ok = (isinstance(data, dict) and isinstance(data.get("checks"), list) and isinstance(data.get("skipped"), list)
          and all(_own_check(r, name) for r in data["checks"])
          and all(isinstance(x, dict) and set(x) == {"check", "reason"} and _own_name(x["check"], name)
                  and isinstance(x["reason"], str) for x in data["skipped"]))
    if not ok:
        raise ValueError("checks that are not its own (not named for it, or not plain values)")
    for r, key in [(r, "detail") for r in data["checks"]] + [(x, "reason") for x in data["skipped"]]:
        r[key] = clip(written_out(r[key]), CHECK_DETAIL_CHARS)
    return data


def _isolated_checks(c: _Checks, skips: list, name: str, device: str, profile: str, seed: int) -> None:
    """``_impl_checks`` of the adapter ``name`` in a process of its own (``_parity.in_own_process``): its import and
    its calls never reach this process, nsa_core's checks or the reference. Its checks come back as JSON, checked
    here; a process that ends without them is that implementation's failed check, named."""
    job = {"kind": "sanity", "name": name, "device": device, "profile": profile, "seed": seed}
    got, problem = _parity.in_own_process(job, lambda path: _read_checks(path, name))
    if got is None:
        c.add(f"{name} adapter", False, f"{name}: {problem}")
        return
    for r in got["checks"]:
        c.add(r["check"], r["ok"], r["detail"], echo=False,
              **{k: v for k, v in r.items() if k not in ("check", "ok", "detail")})
    skips.extend(got["skipped"])


class Sanity(Stage):
    name = "sanity"
    preload_flash = True  # calls the flash paths: its spare imports FA-4's CUDA-free part
    order = 20
    requires = ()
    description = "every branch and NSAAttention: forward + backward, finite, shapes, causal, GQA-consistent"
    timeout_s = 900.0
    options = (_seed.option(None), _parity.impl_option())

    def run(self, ctx) -> StageResult:
        import torch

        from nsa_core import NSAAttention, NSAConfig, routing, testing
        from nsa_core import functional as F

        shape = SHAPES[ctx.profile]
        cfg = NSAConfig(**shape.cfg)
        device = ctx.device
        try:
            r = routing.decide(device)
        except ValueError as e:
            return StageResult(Status.FAIL, f"routing.decide({device!r}) rejected its input: {e}")
        rj = r.to_json()
        write_json(ctx.dir / "routing.json", rj)
        backends = {b: r.backend(b, S=shape.T) for b in ("cmp", "slc", "win")}
        seed = _seed.resolve(ctx)  # --seed, else fresh per run; recorded + replay command printed
        impl_text = (ctx.options or {}).get("impl")
        replay = _seed.announce(ctx, self.name, seed, impl=impl_text if impl_text not in (None, "nsa_core") else None)
        gen = torch.Generator(device="cpu").manual_seed(seed)
        c = _Checks()
        skips: list[dict] = []
        sel_q, sel_k = _selection_inputs(shape, gen, device)
        names = _parity.impl_names(ctx)
        if "nsa_core" in names:  # the built-in: its routed backends, selection and the module
            for branch in ("cmp", "slc", "win"):
                c.guard(f"{branch}/{backends[branch]}",
                        lambda b=branch: _check_branch(c, F, testing, b, backends[b], shape, cfg, gen, device,
                                                       sel_q, sel_k))
            c.guard("select", lambda: _check_selection(c, F, shape, cfg, gen, device))
            c.guard("module", lambda: _check_module(c, NSAAttention, NSAConfig, shape, cfg, gen, device, backends))
        for name in names:  # every implementation: its parts on the same shapes
            if _parity.in_stage_process(name):  # nsa_core (or a plugin's adapter with NSA_RUN_ADAPTER_PROCESS=0)
                _impl_checks(c, skips, _parity.load_impl(name), testing, shape, cfg, gen, device, sel_q, sel_k,
                             ctx.profile)
            else:  # a plugin's adapter: in a process of its own, never in this one (stop 42; round 47)
                _isolated_checks(c, skips, name, device, ctx.profile, seed)
        for sk in skips:
            print(f"[SKIP] {sk['check']}: {sk['reason']}", flush=True)
        doc = {"schema_version": 1, "run_id": ctx.run_id, "time": now_iso(), "device": device,
               "profile": ctx.profile, "seed": seed, "replay": replay,
               "shape": {k: v for k, v in vars(shape).items() if k != "cfg"}, "cfg": cfg.to_dict(),
               "backends": backends,
               "routing": {b: {"backend": backends[b], "reason": rj["branches"][b]["reason"]} for b in backends},
               "checks": c.rows, "skipped": skips, "impls": names,
               "shared_case": {k: v for k, v in vars(SHARED[ctx.profile]).items() if k != "dim"}}
        if device == "cuda":
            doc["gpu"] = torch.cuda.get_device_name(0)
        write_json(ctx.dir / "sanity.json", doc)
        write_text(ctx.dir / "sanity.out", _render(doc))
        files = ["routing.json", "sanity.out", "sanity.json"]
        failed = [r_["check"] + ": " + r_["detail"] for r_ in c.rows if not r_["ok"]]
        worst = max((r_.get("rel_err", 0.0) / r_["tol"] for r_ in c.rows if r_.get("tol")
                     and math.isfinite(r_.get("rel_err", math.nan))), default=None)
        metrics = {"checks": len(c.rows), "failed": len(failed), "backends": backends,
                   "worst_err_over_tol": worst, "seed": seed, "impls": names, "skipped": len(skips)}
        skip_note = (f"; {len(skips)} not run (outside an implementation's constraints: "
                     + "; ".join(dict.fromkeys(f"{sk['reason']}" for sk in skips))[:500] + ")") if skips else ""
        if failed:
            print(f"replay with: {replay}", flush=True)
            return StageResult(Status.FAIL, f"{len(failed)}/{len(c.rows)} checks failed: " + "; ".join(failed[:3])
                               + skip_note, files=files, metrics=metrics, hint=f"replay: {replay}")
        if not c.rows:
            return StageResult(Status.SKIP, f"no check runs here{skip_note}", files=files, metrics=metrics)
        impl_note = "" if names == ["nsa_core"] else f"; implementations {', '.join(names)}"
        return StageResult(Status.PASS, f"{len(c.rows)} checks ok on {device} (backends "
                           + ", ".join(f"{b}={be}" for b, be in backends.items()) + ")" + impl_note + skip_note,
                           files=files, metrics=metrics)
