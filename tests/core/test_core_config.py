"""NSAConfig (DESIGN §2 constraints): defaults, every ValueError path, derived geometry."""

from __future__ import annotations

import dataclasses
import re

import pytest

from nsa_core import NSAConfig

try:  # tests/ is on sys.path under pytest's default (prepend) import mode
    import _naive as N
    from _naive import one_cpu_thread  # noqa: F401  (autouse fixture)
except ImportError:  # pragma: no cover - run as a package (tests/__init__.py or importlib mode)
    from tests import _naive as N
    from tests._naive import one_cpu_thread  # noqa: F401


def test_defaults_are_the_paper_values():
    cfg = NSAConfig()
    assert (cfg.l, cfg.d, cfg.l_sel, cfg.n_sel, cfg.w, cfg.phi) == (32, 16, 64, 16, 512, "avg")
    assert cfg.to_dict() == {"l": 32, "d": 16, "l_sel": 64, "n_sel": 16, "w": 512, "phi": "avg"}


@pytest.mark.parametrize("kw", [
    pytest.param(dict(l=16, d=16, l_sel=16, n_sel=3, w=1), id="l=l_sel=d-n3-w1"),
    pytest.param(dict(l=32, d=16, l_sel=64, n_sel=3, w=512, phi="mlp"), id="paper-mlp-n3"),
    pytest.param(dict(l=8, d=2, l_sel=32, n_sel=7, w=5), id="a16-b4"),
    pytest.param(dict(l=1, d=1, l_sel=1, n_sel=3, w=1), id="all-ones"),
])
def test_valid_configs_construct(kw):
    cfg = NSAConfig(**kw)
    for k, v in kw.items():
        assert getattr(cfg, k) == v


# (kwargs, the parameter the message must name, a regex for the rule)
BAD = [
    (dict(l=0), "l", r"positive"),
    (dict(d=0), "d", r"positive"),
    (dict(l_sel=0), "l_sel", r"positive"),
    (dict(n_sel=0), "n_sel", r"positive|>= ?3"),
    (dict(w=0), "w", r"positive"),
    (dict(l=-32), "l", r"positive"),
    (dict(d=-16), "d", r"positive"),
    (dict(l_sel=-64), "l_sel", r"positive"),
    (dict(n_sel=-1), "n_sel", r"positive|>= ?3"),
    (dict(w=-512), "w", r"positive"),
    (dict(l=32.0), "l", r"int"),
    (dict(d="16"), "d", r"int"),
    (dict(w=None), "w", r"int"),
    (dict(n_sel=True), "n_sel", r"int"),
    (dict(l=40, d=16, l_sel=80), "d", r"divide"),          # 16 does not divide 40
    (dict(l=32, d=16, l_sel=72), "d", r"divide"),          # 16 does not divide 72
    (dict(l=128, d=16, l_sel=64), "l", r"<="),             # l > l_sel
    (dict(l=64, d=32, l_sel=32), "l", r"<="),
    (dict(n_sel=2), "n_sel", r">= ?3"),
    (dict(n_sel=1), "n_sel", r">= ?3"),
    (dict(phi="max"), "phi", r"avg"),
    (dict(phi="AVG"), "phi", r"avg"),
]


@pytest.mark.parametrize("kw,param,rule", [pytest.param(*b, id="-".join(f"{k}={v}" for k, v in b[0].items()))
                                           for b in BAD])
def test_invalid_config_raises_value_error_naming_param_and_rule(kw, param, rule):
    with pytest.raises(ValueError) as ei:
        NSAConfig(**kw)
    msg = str(ei.value)
    assert param in msg, f"message does not name {param!r}: {msg}"
    assert re.search(rule, msg), f"message does not state the rule /{rule}/: {msg}"


def test_l_48_is_valid_when_d_divides_it():
    # the rules are d | l, d | l_sel, l <= l_sel: l need not divide l_sel
    assert NSAConfig(l=48, d=16, l_sel=64, n_sel=4).l == 48


def test_config_is_frozen():
    cfg = NSAConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.l = 64  # type: ignore[misc]


@pytest.mark.parametrize("l,d,l_sel", [(32, 16, 64), (16, 16, 16), (8, 2, 32), (32, 32, 64)])
def test_derived_geometry_matches_the_visibility_rule(l, d, l_sel):
    cfg = NSAConfig(l=l, d=d, l_sel=l_sel)
    for T in [0, 1, l - 1, l, l + 1, l + d - 1, l + d, 3 * l_sel + 5, 200]:
        # compressed token i exists once raw tokens [i*d, i*d+l) exist: i*d + l - 1 <= T - 1
        assert cfg.num_cmp(T) == N.n_cmp_tokens(T, l, d), T
        assert cfg.num_sel_blocks(T) == len({s // l_sel for s in range(T)}), T
