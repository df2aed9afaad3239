"""Triton selection attention (nsa_core.selection.attention) vs the float64 reference.

On CPU the real kernels run in the Triton interpreter (TRITON_INTERPRET=1, set here before
triton is imported; fp32/fp16 only, tiny shapes). On a GPU the same tests run compiled, plus
a bf16 case. Every output is NaN-poisoned before the kernels write it (triton_sel.POISON), so
an unwritten element fails the comparison.
"""

from __future__ import annotations

import importlib
import math
import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import
triton = pytest.importorskip("triton", reason="needs triton: pip install triton")

from nsa_core import NSAConfig  # noqa: E402
from nsa_core import functional as F  # noqa: E402
from nsa_core.selection import attention as triton_sel  # noqa: E402
from nsa_core.selection import reference as _reference  # noqa: E402
from nsa_core.testing import DTYPES_BY_NAME, case_id, compare  # noqa: E402

DEV = "cuda" if CUDA else "cpu"


@pytest.fixture(autouse=True, scope="module")
def _interpreted_kernels():
    """If another module imported the kernels before TRITON_INTERPRET was set, re-decorate them."""
    if not CUDA:
        os.environ["TRITON_INTERPRET"] = "1"
        if type(triton_sel._k._fwd_kernel).__name__ != "InterpretedFunction":
            importlib.reload(triton_sel._k)
    old = triton_sel.POISON
    triton_sel.POISON = True
    yield
    triton_sel.POISON = old


def _cfg(l_sel=16, n=4):
    return NSAConfig(l=l_sel, d=l_sel // 2, l_sel=l_sel, n_sel=n, w=32)


def _inputs(B, T, HQ, G, dk, dv, dtype, n=4, l_sel=16, ragged=False, seed=0, S=None):
    """Fresh random inputs; block indices from F.select_blocks (queries = last T of S positions)."""
    S = S or T
    gen = torch.Generator().manual_seed(seed)
    dt = DTYPES_BY_NAME[dtype] if isinstance(dtype, str) else dtype
    q = torch.randn(B, T, HQ, dk, generator=gen).to(DEV, dt)
    k = torch.randn(B, S, G, dk, generator=gen).to(DEV, dt)
    v = torch.randn(B, S, G, dv, generator=gen).to(DEV, dt)
    qs = torch.randn(B, S, HQ, dk, generator=gen)
    qs[:, S - T:] = q.float().cpu()
    idx, cnt = F.select_blocks(qs, torch.randn(B, S, G, dk, generator=gen), _cfg(l_sel, n))
    idx, cnt = idx[:, S - T:].contiguous(), cnt[:, S - T:].contiguous()
    if ragged:  # drop ~half the live blocks (some rows keep none): counts < n, -1 padded, ascending
        live = torch.arange(n) < cnt[..., None]
        keep = live & (torch.rand(idx.shape, generator=gen) < 0.5)
        big = torch.iinfo(torch.int32).max
        idx = torch.sort(torch.where(keep, idx, torch.full_like(idx, big)), -1).values
        idx = torch.where(idx == big, torch.full_like(idx, -1), idx).contiguous()
        cnt = keep.sum(-1).to(torch.int32)
    do = torch.randn(B, T, HQ, dv, generator=gen).to(DEV, dt)
    return q, k, v, idx.to(DEV), cnt.to(DEV), do


def _naive_lse(q, k, idx, cnt, block_size, scale):
    """Per (b, t, head) log-sum-exp over the selected causal keys by explicit loops (float64)."""
    B, T, HQ, _ = q.shape
    S, G = k.shape[1], k.shape[2]
    h = HQ // G
    out = torch.full((B, T, HQ), -math.inf, dtype=torch.float64)
    q64, k64 = q.double().cpu(), k.double().cpu()
    for b in range(B):
        for t in range(T):
            pos = S - T + t
            for hq in range(HQ):
                g = hq // h
                keys = [s for j in idx[b, t, g, : cnt[b, t, g]].tolist()
                        for s in range(j * block_size, min((j + 1) * block_size, S)) if s <= pos]
                if keys:
                    out[b, t, hq] = torch.logsumexp(k64[b, keys, g] @ q64[b, t, hq] * scale, 0)
    return out


FWD_CASES = [
    pytest.param(2, 40, 4, 2, 24, 16, "fp32", False, id=case_id(2, 40, 4, 2, 24, 16, "fp32")),  # h=2, B=2
    pytest.param(1, 50, 2, 2, 16, 32, "fp16", False, id=case_id(1, 50, 2, 2, 16, 32, "fp16")),  # h=1
    pytest.param(1, 45, 6, 2, 16, 16, "fp32", True, id=case_id(1, 45, 6, 2, 16, 16, "fp32") + "-ragged"),  # h=3
    pytest.param(1, 33, 16, 1, 16, 16, "fp32", False, id=case_id(1, 33, 16, 1, 16, 16, "fp32")),  # h=16
]


@pytest.mark.parametrize("B,T,HQ,G,dk,dv,dtype,ragged", FWD_CASES)
def test_forward_matches_reference(B, T, HQ, G, dk, dv, dtype, ragged):
    q, k, v, idx, cnt, _ = _inputs(B, T, HQ, G, dk, dv, dtype, ragged=ragged, seed=T)
    o, lse = triton_sel.selection_attention_fwd(q, k, v, idx, cnt, 16)
    ref = _reference.selection_attention(q.double(), k.double(), v.double(), idx, cnt, 16)
    c = compare(o, ref, DTYPES_BY_NAME[dtype])
    assert c.ok, c
    ref_lse = _naive_lse(q, k, idx, cnt, 16, 1 / math.sqrt(dk))
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), seen)  # -inf exactly where a query sees no key
    cl = compare(lse.cpu()[seen], ref_lse[seen], torch.float32)
    assert cl.ok, cl
    if ragged:
        assert (~seen).any(), "the ragged case should contain queries that see no key"
        assert torch.all(o.cpu()[~seen] == 0)


BWD_CASES = [
    pytest.param("index", "fp32", id="index-fp32"),
    pytest.param("atomic", "fp32", id="atomic-fp32"),
    pytest.param("index_dq_atomic", "fp32", id="index_dq_atomic-fp32"),
    pytest.param("index", "fp16", id="index-fp16"),
]


@pytest.mark.parametrize("mode,dtype", BWD_CASES)
def test_backward_matches_reference(mode, dtype, monkeypatch):
    # seg=5 splits the busiest key blocks over several segments: the fp32 partial + reduce path runs
    monkeypatch.setitem(triton_sel.CONFIG, "dkv", {**triton_sel.CONFIG["dkv"], "seg": 5})
    B, T, HQ, G, dk, dv = 2, 40, 8, 2, 24, 16  # h=4, dk != dv, T not a multiple of 16
    q, k, v, idx, cnt, do = _inputs(B, T, HQ, G, dk, dv, dtype, seed=3)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    o = triton_sel.selection_attention(*leaves, idx, cnt, 16, dkv_mode=mode)
    o.backward(do)
    r = [x.double().requires_grad_(True) for x in (q, k, v)]
    ro = _reference.selection_attention(*r, idx, cnt, 16)
    ro.backward(do.double())
    dt = DTYPES_BY_NAME[dtype]
    assert compare(o, ro, dt).ok
    for name, a, b in zip(("dq", "dk", "dv"), leaves, r, strict=True):
        c = compare(a.grad, b.grad, dt)
        assert c.ok, f"{name}: {c}"


def test_backward_no_visible_keys_is_finite():
    q, k, v, idx, cnt, do = _inputs(1, 30, 4, 2, 16, 16, "fp32", ragged=True, seed=5)
    assert (cnt == 0).any()
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    triton_sel.selection_attention(*leaves, idx, cnt, 16).backward(do)
    r = [x.double().requires_grad_(True) for x in (q, k, v)]
    _reference.selection_attention(*r, idx, cnt, 16).backward(do.double())
    for a, b in zip(leaves, r, strict=True):
        assert compare(a.grad, b.grad, torch.float32).ok


def test_queries_are_last_positions_of_longer_keys():
    """Tq < S (decode-like): query i sits at position S - Tq + i."""
    q, k, v, idx, cnt, _ = _inputs(1, 7, 4, 2, 16, 16, "fp32", S=45, seed=9)
    o = triton_sel.selection_attention(q, k, v, idx, cnt, 16)
    ref = _reference.selection_attention(q.double(), k.double(), v.double(), idx, cnt, 16)
    assert compare(o, ref, torch.float32).ok


def test_strided_inputs_and_custom_scale():
    """q/k/v as slices of wider tensors (last dim contiguous), an explicit scale."""
    q, k, v, idx, cnt, _ = _inputs(1, 30, 4, 2, 16, 16, "fp32", seed=11)
    qw = torch.cat([q, torch.randn_like(q)], dim=-1)[..., :16]
    kvw = torch.cat([k, v], dim=-1)
    kw, vw = kvw[..., :16], kvw[..., 16:]
    assert not qw.is_contiguous() and not kw.is_contiguous()
    o = triton_sel.selection_attention(qw, kw, vw, idx, cnt, 16, scale=0.3)
    ref = _reference.selection_attention(q.double(), k.double(), v.double(), idx, cnt, 16, scale=0.3)
    assert compare(o, ref, torch.float32).ok


def test_functional_triton_backend_dispatches_here():
    q, k, v, idx, cnt, _ = _inputs(1, 30, 4, 2, 16, 16, "fp32", seed=13)
    o = F.selection_attention(q, k, v, idx, cnt, _cfg(), backend="triton")
    ref = F.selection_attention(q.double(), k.double(), v.double(), idx, cnt, _cfg(), backend="reference")
    assert compare(o, ref, torch.float32).ok


def test_deterministic_backward_is_bitwise_reproducible():
    q, k, v, idx, cnt, do = _inputs(1, 40, 4, 2, 16, 16, "fp32", seed=17)

    def grads():
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        triton_sel.selection_attention(*leaves, idx, cnt, 16, deterministic=True).backward(do)
        return [x.grad for x in leaves]

    assert all(torch.equal(a, b) for a, b in zip(grads(), grads(), strict=True))
    with pytest.raises(ValueError, match="deterministic"):
        triton_sel.selection_attention(q, k, v, idx, cnt, 16, deterministic=True, dkv_mode="atomic")


@pytest.mark.skipif(not CUDA, reason="bf16 loads garbage in the Triton interpreter: GPU only")
def test_bf16_on_gpu():
    q, k, v, idx, cnt, do = _inputs(2, 300, 32, 2, 64, 32, "bf16", n=8, l_sel=32, seed=19)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    o = triton_sel.selection_attention(*leaves, idx, cnt, 32)
    o.backward(do)
    r = [x.double().requires_grad_(True) for x in (q, k, v)]
    ro = _reference.selection_attention(*r, idx, cnt, 32)
    ro.backward(do.double())
    assert compare(o, ro, torch.bfloat16).ok
    for a, b in zip(leaves, r, strict=True):
        assert compare(a.grad, b.grad, torch.bfloat16).ok


# ---- invalid input: a clear ValueError, never a silent wrong answer ---------------------------

def _bad(kind):
    q, k, v, idx, cnt, _ = _inputs(1, 40, 4, 2, 16, 16, "fp32", seed=23)
    args = dict(q=q, k=k, v=v, block_idx=idx, block_count=cnt, block_size=16)
    if kind == "dtype-mix":
        args["k"] = k.half()
    elif kind == "fp64":
        args.update(q=q.double(), k=k.double(), v=v.double())
    elif kind == "idx-int64":
        args["block_idx"] = idx.long()
    elif kind == "id-too-large":
        i = idx.clone()
        # 40 keys / 16 -> blocks 0..2: live ids 1, 2, 3 stay ascending but 3 does not exist
        i[0, -1, 0, : cnt[0, -1, 0]] = torch.arange(int(cnt[0, -1, 0]), dtype=torch.int32) + 1
        args["block_idx"] = i
    elif kind == "id-negative-live":
        i = idx.clone()
        i[0, 20, 1, 0] = -1
        args["block_idx"] = i
    elif kind == "unsorted":
        i = idx.clone()
        row = i[0, 39, 0]
        row[:2] = row[:2].flip(0)
        args["block_idx"] = i
    elif kind == "count-over-n":
        c = cnt.clone()
        c[0, 5, 0] = 5
        args["block_count"] = c
    elif kind == "padding-not-minus-one":
        i = idx.clone()
        i[0, 0, 0, -1] = 0
        args["block_idx"] = i
    elif kind == "h-over-16":
        args.update(q=torch.randn(1, 40, 34, 16, device=DEV), k=torch.randn(1, 40, 2, 16, device=DEV),
                    v=torch.randn(1, 40, 2, 16, device=DEV))
    elif kind == "last-dim-strided":
        args["q"] = torch.randn(1, 40, 4, 32, device=DEV)[..., ::2]
    elif kind == "idx-not-contiguous":
        args["block_idx"] = idx.transpose(1, 2).contiguous().transpose(1, 2)
    elif kind == "block-size":
        args["block_size"] = 0
    elif kind == "dk-mismatch":
        args["k"] = torch.randn(1, 40, 2, 8, device=DEV)
    elif kind == "batch-mismatch":
        args["v"] = torch.randn(2, 40, 2, 16, device=DEV)
    return args


BAD = {
    "dtype-mix": "dtype mix", "fp64": "not supported", "idx-int64": "int32", "id-too-large": "out of range",
    "id-negative-live": "out of range", "unsorted": "ascending", "count-over-n": "block_count outside",
    "padding-not-minus-one": "padding", "h-over-16": "outside 1..16", "last-dim-strided": "contiguous in its last",
    "idx-not-contiguous": "contiguous", "block-size": "block_size", "dk-mismatch": "head dim",
    "batch-mismatch": "batch mismatch",
}


@pytest.mark.parametrize("kind", list(BAD))
def test_invalid_input_raises_valueerror(kind):
    args = _bad(kind)
    with pytest.raises(ValueError, match=BAD[kind]):
        triton_sel.selection_attention(**args)


@pytest.mark.parametrize("qt", [2, 4])
def test_multi_token_programs_match_reference(qt, monkeypatch):
    """QT tokens per program (forced blocks loaded once per tile): fwd and dq, tiles straddling blocks."""
    monkeypatch.setitem(triton_sel.CONFIG, "fwd", {**triton_sel.CONFIG["fwd"], "qt": qt})
    monkeypatch.setitem(triton_sel.CONFIG, "dq", {**triton_sel.CONFIG["dq"], "qt": qt})
    q, k, v, idx, cnt, do = _inputs(1, 23, 4, 2, 16, 24, "fp32", n=4, l_sel=8, S=26, seed=29)  # Q_OFF=3
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    o = triton_sel.selection_attention(*leaves, idx, cnt, 8)
    o.backward(do)
    r = [x.double().requires_grad_(True) for x in (q, k, v)]
    ro = _reference.selection_attention(*r, idx, cnt, 8)
    ro.backward(do.double())
    assert compare(o, ro, torch.float32).ok
    for name, a, b in zip(("dq", "dk", "dv"), leaves, r, strict=True):
        assert compare(a.grad, b.grad, torch.float32).ok, name
