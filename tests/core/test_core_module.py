"""NSAAttention (prefill) against an independent composition of the naive oracle.

The oracle re-does the layer by hand from the module's weights: linear projections, RoPE
(half-split, written per position and frequency in tests/_naive.py), compression keys roped
BEFORE phi, the naive three branches and Eq. 5 gates, the output projection. The gate MLP is
used as the black-box MLP of Eq. 5 (its output goes through our own sigmoid / layout).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from nsa_core import NSAAttention, NSAConfig
from nsa_core.module import rope
from nsa_core.testing import case_id, compare

try:  # tests/ is on sys.path under pytest's default (prepend) import mode
    import _naive as N
    from _naive import one_cpu_thread  # noqa: F401  (autouse fixture)
except ImportError:  # pragma: no cover - run as a package (tests/__init__.py or importlib mode)
    from tests import _naive as N
    from tests._naive import one_cpu_thread  # noqa: F401

DEV = N.DEVICE

# B, T, dim, HQ, G, dk, dv, (l, d, l_sel, n_sel, w)
MOD_CASES = [
    (2, 21, 16, 4, 2, 8, 6, (4, 2, 8, 3, 5)),      # B=2, T not a multiple, dk != dv, w < T
    (1, 5, 8, 2, 1, 4, 4, (8, 4, 8, 3, 16)),       # T < l, T < w
    (1, 19, 16, 16, 1, 4, 4, (4, 4, 4, 3, 6)),     # h = 16, sparse selection
    (1, 12, 8, 2, 2, 4, 4, (4, 2, 4, 3, 3)),       # h = 1
    (1, 9, 32, 2, 1, 192, 128, (4, 2, 4, 3, 4)),   # the paper's dk / dv
]


def _id(c, **kw):
    B, T, dim, HQ, G, dk, dv, (l, d, ls, n, w) = c
    return case_id(B, T, HQ, G, dk, dv, "fp64", dim=dim, l=l, d=d, ls=ls, n=n, w=w, **kw)


def _module(c, phi="avg", backend="reference", seed=0, dtype=torch.float64):
    B, T, dim, HQ, G, dk, dv, (l, d, ls, n, w) = c
    torch.manual_seed(seed)
    m = NSAAttention(dim, HQ, G, dk, dv, NSAConfig(l=l, d=d, l_sel=ls, n_sel=n, w=w, phi=phi), backend=backend)
    return m.to(DEV, dtype)


def oracle(m: NSAAttention, x: torch.Tensor) -> torch.Tensor:
    """y [B, T, dim] of the layer, float64 on the CPU, from the module's weights and the naive oracle."""
    cfg = m.cfg
    x = N.cpu64(x)
    B, T, _ = x.shape
    HQ, G, dk, dv = m.HQ, m.G, m.dk, m.dv

    def lin(layer, n, dh):
        return (x @ N.cpu64(layer.weight).T).reshape(B, T, n, dh)

    q = N.rope_half(lin(m.q_proj, HQ, dk), m.rope_base)
    k_cmp = N.rope_half(lin(m.k_cmp_proj, G, dk), m.rope_base)  # RoPE before phi
    k_sel = N.rope_half(lin(m.k_sel_proj, G, dk), m.rope_base)
    k_win = N.rope_half(lin(m.k_win_proj, G, dk), m.rope_base)
    v_cmp, v_sel, v_win = lin(m.v_cmp_proj, G, dv), lin(m.v_sel_proj, G, dv), lin(m.v_win_proj, G, dv)
    with torch.no_grad():
        gate_logits = copy.deepcopy(m.gate).to("cpu", torch.float64)(x).reshape(B, T, HQ, 3)
    gates = 1.0 / (1.0 + torch.exp(-gate_logits))  # Eq. 5 sigmoid
    kc = vc = None
    if cfg.phi == "mlp":
        def mlp(phi, z):
            return N.compress_mlp(z, cfg.l, cfg.d, *(N.cpu64(p) for p in
                                  (phi.pos, phi.fc1.weight, phi.fc1.bias, phi.fc2.weight, phi.fc2.bias)))
        kc, vc = mlp(m.phi_k, k_cmp), mlp(m.phi_v, v_cmp)
    o = N.nsa(q, k_cmp, v_cmp, k_sel, v_sel, k_win, v_win, gates, cfg.l, cfg.d, cfg.l_sel, cfg.n_sel, cfg.w,
              kc=kc, vc=vc)[0]
    return o.reshape(B, T, HQ * dv) @ N.cpu64(m.o_proj.weight).T


# ---- construction --------------------------------------------------------------------------

@pytest.mark.parametrize("phi", ["avg", "mlp"])
def test_layout_of_the_layer(phi):
    dim, HQ, G, dk, dv = 24, 4, 2, 8, 6
    m = NSAAttention(dim, HQ, G, dk, dv, NSAConfig(l=4, d=2, l_sel=8, n_sel=3, w=8, phi=phi))
    assert m.q_proj.weight.shape == (HQ * dk, dim)
    for br in ("cmp", "sel", "win"):
        assert getattr(m, f"k_{br}_proj").weight.shape == (G * dk, dim)
        assert getattr(m, f"v_{br}_proj").weight.shape == (G * dv, dim)
    # separate K/V per branch (paper §3.3.3): six distinct parameter tensors
    kv = [getattr(m, f"{kv}_{br}_proj").weight for kv in "kv" for br in ("cmp", "sel", "win")]
    assert len({id(p) for p in kv}) == 6
    assert m.o_proj.weight.shape == (dim, HQ * dv)
    assert isinstance(m.gate, torch.nn.Module)
    assert m.gate(torch.randn(3, dim)).shape == (3, HQ * 3)
    if phi == "avg":
        assert m.phi_k is None and m.phi_v is None
    else:
        assert isinstance(m.phi_k, torch.nn.Module) and isinstance(m.phi_v, torch.nn.Module)
        # the phi parameters belong to the layer (an optimiser over m.parameters() trains them)
        own = {id(p) for p in m.parameters()}
        assert all(id(p) in own for p in (*m.phi_k.parameters(), *m.phi_v.parameters()))


@pytest.mark.parametrize("args,match", [
    ((16, 4, 3, 8, 8), "n_heads"),    # HQ not a multiple of G
    ((16, 2, 4, 8, 8), "n_heads"),    # G > HQ
    ((0, 4, 2, 8, 8), "dim"),
    ((16, 0, 2, 8, 8), "n_heads"),
    ((16, 4, 0, 8, 8), "n_kv_groups"),
    ((16, 4, 2, -8, 8), "d_k"),
    ((16, 4, 2, 8, 0), "d_v"),
    ((16, 4, 2, 7, 8), "d_k"),        # RoPE needs an even d_k
])
def test_bad_construction_raises_value_error(args, match):
    with pytest.raises(ValueError, match=match):
        NSAAttention(*args, NSAConfig())


def test_bad_input_shape_raises_value_error():
    m = NSAAttention(16, 4, 2, 8, 8, NSAConfig(l=4, d=2, l_sel=8, n_sel=3, w=8)).to(DEV)
    for bad in (torch.randn(1, 10, 12), torch.randn(10, 16), torch.randn(1, 2, 10, 16)):
        with pytest.raises(ValueError, match="x must be"):
            m(bad.to(DEV))


# ---- RoPE ----------------------------------------------------------------------------------

def test_rope_matches_the_naive_rotation_and_is_relative():
    x = N.randn(2, 11, 3, 8, seed=1)
    got = rope(x, torch.arange(11, device=DEV))
    _check(got, N.rope_half(N.cpu64(x)), "rope")
    assert torch.allclose(got.norm(dim=-1), x.norm(dim=-1), atol=1e-12)  # a rotation
    # <rope(q, m), rope(k, n)> depends on m - n only
    q, k = N.randn(1, 1, 1, 8, seed=2), N.randn(1, 1, 1, 8, seed=3)

    def dot(mq, nk):
        a = rope(q, torch.tensor([mq], device=DEV))
        b = rope(k, torch.tensor([nk], device=DEV))
        return float((a * b).sum())

    assert math.isclose(dot(7, 3), dot(104, 100), abs_tol=1e-12)
    assert math.isclose(dot(0, 5), dot(20, 25), abs_tol=1e-12)
    assert not math.isclose(dot(7, 3), dot(7, 4), abs_tol=1e-6)


# ---- the layer against the oracle ----------------------------------------------------------

def _check(out, ref, what, dtype=torch.float64, zero_floor=0.0):
    r = compare(out.detach().cpu(), ref.detach().cpu(), dtype)
    assert r.ok or r.max_abs <= zero_floor, f"{what}: {r}"


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("phi", ["avg", "mlp"])
@pytest.mark.parametrize("c", [pytest.param(c, id=_id(c)) for c in MOD_CASES])
def test_module_matches_oracle(c, phi, backend):
    m = _module(c, phi, backend, seed=1)
    x = N.randn(c[0], c[1], c[2], seed=2)
    y, _cache = m(x)
    assert y.shape == x.shape and y.dtype == torch.float64
    _check(y, oracle(m, x), f"module {phi}/{backend}")


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_module_fp32_matches_oracle(backend):
    c = MOD_CASES[0]
    m = _module(c, "avg", backend, seed=3, dtype=torch.float32)
    x = N.randn(c[0], c[1], c[2], seed=4, dtype=torch.float32)
    y, _ = m(x)
    assert y.dtype == torch.float32
    _check(y, oracle(m, x), f"module fp32/{backend}", torch.float32)


@pytest.mark.parametrize("onehot", [1, 2], ids=["slc", "win"])
@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_module_with_one_hot_gate_equals_full_causal_attention(onehot, backend):
    # n * l' >= T and w >= T; the gate's last layer pinned to a constant (0, 1, 0) / (0, 0, 1)
    T, dim, HQ, G, dk, dv = 40, 16, 4, 2, 8, 8
    cfg = NSAConfig(l=4, d=2, l_sel=8, n_sel=5, w=T)
    torch.manual_seed(5)
    m = NSAAttention(dim, HQ, G, dk, dv, cfg, backend=backend).to(DEV)
    last = m.gate[-1] if isinstance(m.gate, torch.nn.Sequential) else None
    if last is None or not isinstance(last, torch.nn.Linear):
        pytest.fail("gate is not an MLP ending in a Linear layer; cannot pin it")
    with torch.no_grad():
        last.weight.zero_()
        b = torch.full((HQ, 3), -40.0)
        b[:, onehot] = 40.0
        last.bias.copy_(b.reshape(-1))
    x = N.randn(2, T, dim, seed=6, dtype=torch.float32)
    y, _ = m(x)
    br = "sel" if onehot == 1 else "win"
    with torch.no_grad():
        x64, m = x.double(), copy.deepcopy(m).double()
        q = rope(m.q_proj(x64).view(2, T, HQ, dk), torch.arange(T, device=DEV))
        k = rope(getattr(m, f"k_{br}_proj")(x64).view(2, T, G, dk), torch.arange(T, device=DEV))
        v = getattr(m, f"v_{br}_proj")(x64).view(2, T, G, dv)
        h = HQ // G
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(h, 1), v.transpose(1, 2).repeat_interleave(h, 1),
            is_causal=True).transpose(1, 2)
        ref = m.o_proj(o.reshape(2, T, HQ * dv))
    err = (y.double() - ref).abs().max().item()
    assert torch.isfinite(y).all() and err < 1e-5, err


@pytest.mark.parametrize("phi", ["avg", "mlp"])
def test_module_is_causal(phi):
    c = (1, 30, 16, 4, 2, 8, 6, (4, 2, 8, 3, 5))
    m = _module(c, phi, seed=7)
    x = N.randn(1, 30, 16, seed=8)
    y, _ = m(x)
    for t in (0, 4, 15, 28):
        x2 = x.clone()
        x2[:, t + 1:] = N.randn(1, 30 - t - 1, 16, seed=50 + t, scale=5.0)
        y2, _ = m(x2)
        assert (y[:, : t + 1] - y2[:, : t + 1]).abs().max().item() < 1e-13, t
        assert (y[:, t + 1:] - y2[:, t + 1:]).abs().max().item() > 1e-4, t


@pytest.mark.parametrize("phi", ["avg", "mlp"])
def test_gradients_reach_every_projection_the_gate_and_phi(phi):
    c = (2, 26, 16, 4, 2, 8, 6, (4, 2, 8, 3, 5))
    m = _module(c, phi, seed=9)
    x = N.randn(2, 26, 16, seed=10, requires_grad=True)
    y, _ = m(x)
    y.square().sum().backward()
    names = [n for n, _ in m.named_parameters()]
    for must in ("q_proj", "k_cmp_proj", "v_cmp_proj", "k_sel_proj", "v_sel_proj", "k_win_proj", "v_win_proj",
                 "gate", "o_proj") + (("phi_k", "phi_v") if phi == "mlp" else ()):
        assert any(n.startswith(must + ".") for n in names), f"no parameter under {must}"
    for n, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), f"no gradient: {n}"
        if n == "phi_k.fc2.bias":
            # adding a constant vector to every compressed key shifts all scores of a query equally:
            # softmax is invariant, so this gradient is 0 in exact arithmetic (rounding noise only)
            assert p.grad.abs().max() < 1e-12, n
        else:
            assert p.grad.abs().sum() > 1e-8, f"no gradient reaches {n}"
    assert x.grad.abs().sum() > 0


def test_sdpa_module_equals_reference_module():
    c = MOD_CASES[2]
    m_ref = _module(c, "mlp", "reference", seed=11)
    m_sdpa = _module(c, "mlp", "sdpa", seed=11)
    x = N.randn(c[0], c[1], c[2], seed=12)
    xr, xs = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    yr, _ = m_ref(xr)
    ys, _ = m_sdpa(xs)
    _check(ys, yr, "sdpa vs reference module")
    go = N.randn(*yr.shape, seed=13)
    yr.backward(go)
    ys.backward(go)
    _check(xs.grad, xr.grad, "dx")
    for (n, pr), (_, ps) in zip(m_ref.named_parameters(), m_sdpa.named_parameters(), strict=True):
        # phi_k.fc2.bias has an exactly-zero true gradient (softmax shift invariance): compare absolutely
        _check(ps.grad, pr.grad, f"d{n}", zero_floor=1e-14 if n == "phi_k.fc2.bias" else 0.0)


def test_prefill_returns_a_pair():
    c = MOD_CASES[0]
    m = _module(c, seed=14)
    out = m(N.randn(c[0], c[1], c[2], seed=15))
    assert isinstance(out, tuple) and len(out) == 2
    assert out[0].shape == (c[0], c[1], c[2])
