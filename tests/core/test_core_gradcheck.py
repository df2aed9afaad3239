"""torch.autograd.gradcheck in float64 on tiny shapes: every branch, both dense backends, nsa_attention,
compression (avg and mlp phi) and the NSAAttention module (inputs and every parameter).

Shapes are chosen so the selection is really sparse (more candidate blocks than n_sel) and T is
not a multiple of l, d or l_sel. Selection is discrete (no gradient through the choice); with
these seeds no choice sits within gradcheck's eps of a tie.
"""

from __future__ import annotations

import pytest
import torch
from torch.autograd import gradcheck

from nsa_core import NSAConfig
from nsa_core import functional as F

try:  # tests/ is on sys.path under pytest's default (prepend) import mode
    import _naive as N
    from _naive import one_cpu_thread  # noqa: F401  (autouse fixture)
except ImportError:  # pragma: no cover - run as a package (tests/__init__.py or importlib mode)
    from tests import _naive as N
    from tests._naive import one_cpu_thread  # noqa: F401

DEV = N.DEVICE
BACKENDS = ["reference", "sdpa"]
CFG = NSAConfig(l=4, d=2, l_sel=4, n_sel=3, w=3)   # T=14: 4 blocks, n=3 -> a real choice at t >= 12
B, T, HQ, G, DK, DV = 1, 14, 4, 2, 4, 3


def _x(*shape, seed):
    return N.randn(*shape, seed=seed, requires_grad=True)


def _selection(q, k):
    idx, cnt = F.select_blocks(q.detach(), k.detach(), CFG)
    assert int(cnt.max()) == CFG.n_sel and (cnt[0, -1] == 3).all()  # the choice is real at the end
    return idx, cnt


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradcheck_compressed(backend):
    q, k, v = _x(B, T, HQ, DK, seed=1), _x(B, T, G, DK, seed=2), _x(B, T, G, DV, seed=3)
    assert gradcheck(lambda q, k, v: F.compressed_attention(q, k, v, CFG, backend), (q, k, v))


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradcheck_selection(backend):
    q, k, v = _x(B, T, HQ, DK, seed=4), _x(B, T, G, DK, seed=5), _x(B, T, G, DV, seed=6)
    idx, cnt = _selection(q, _x(B, T, G, DK, seed=7))
    assert gradcheck(lambda q, k, v: F.selection_attention(q, k, v, idx, cnt, CFG, backend), (q, k, v))


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradcheck_sliding(backend):
    q, k, v = _x(B, T, HQ, DK, seed=8), _x(B, T, G, DK, seed=9), _x(B, T, G, DV, seed=10)
    assert gradcheck(lambda q, k, v: F.sliding_attention(q, k, v, CFG, backend), (q, k, v))


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradcheck_nsa_attention(backend):
    q = _x(B, T, HQ, DK, seed=11)
    kv = [_x(B, T, G, DK if i % 2 == 0 else DV, seed=12 + i) for i in range(6)]
    gates = N.rand(B, T, HQ, 3, seed=18, requires_grad=True)
    _selection(q, kv[0])
    assert gradcheck(lambda *a: F.nsa_attention(*a, CFG, backend), (q, *kv, gates))


def test_gradcheck_compress_avg():
    x = _x(2, 11, 2, 3, seed=20)
    assert gradcheck(lambda x: F.compress(x, CFG), (x,))


def test_gradcheck_compress_mlp_inputs_and_params():
    from nsa_core.module import CompressionMLP

    cfg = NSAConfig(l=4, d=2, l_sel=4, n_sel=3, w=3, phi="mlp")
    torch.manual_seed(0)
    phi = CompressionMLP(4, 3).double().to(DEV)
    names = [n for n, _ in phi.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for p in phi.parameters())
    x = _x(1, 9, 2, 3, seed=21)

    def f(x, *ps):
        return F.compress(x, cfg, phi=lambda blk: torch.func.functional_call(phi, dict(zip(names, ps, strict=True)),
                                                                             (blk,)))

    assert gradcheck(f, (x, *params))


@pytest.mark.parametrize("phi", ["avg", "mlp"])
def test_gradcheck_module(phi):
    """NSAAttention: gradcheck w.r.t. x (full) and w.r.t. every parameter (fast mode)."""
    from nsa_core import NSAAttention

    cfg = NSAConfig(l=4, d=2, l_sel=4, n_sel=3, w=3, phi=phi)
    torch.manual_seed(0)
    m = NSAAttention(8, 4, 2, 4, 2, cfg).double().to(DEV)
    names = [n for n, _ in m.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for p in m.parameters())
    x = _x(1, 13, 8, seed=22)

    def f(x, *ps):
        return torch.func.functional_call(m, dict(zip(names, ps, strict=True)), (x,))[0]

    assert gradcheck(lambda x: m(x)[0], (x,))
    assert gradcheck(f, (x.detach(), *params), fast_mode=True)
