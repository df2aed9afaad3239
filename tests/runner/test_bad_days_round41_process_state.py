"""Bad days, red-team round 41 B41-1..B41-5, through the CLI: what round 40's copy of nsa_core's
tables and classes did not see. A dict nested in an nsa_core table changed in place (the Triton launch settings of
``scoring.CONFIG``), an nsa_core function changed through its own attributes (``compare.__kwdefaults__["tol"] = 0.5``,
``tolerance.__code__`` swapped: every later parity verdict judged at 0.5), nsa_core's caches forged (a routing
choice, a module among the flash imports), ``math.inf = 0.0`` (nsa_core's ``compare``
calls a wrong output against an all-zero reference ok); and the eager load of nsa_core's modules, where a dependency
exits at import, blamed on the first plugin ("broken adapter: failed to load"). Expected: each put back after the
adapter's code and named, the next verdicts stand; a plugin that imports nothing broken loads."""

from __future__ import annotations

try:
    from _bad_days import changes_then_checks, put_back_and_named, selection_map
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import changes_then_checks, put_back_and_named, selection_map

CHANGES = """
def _select(q, k_cmp, cfg):
    import math
    from nsa_core import functional as F, testing
    from nsa_core.config import NSAConfig
    from nsa_core.selection import scoring

    out = F.select_blocks(q, k_cmp, cfg)
    scoring.CONFIG["score"]["BM"] = 7  # B41-1: one level below the table
    testing.compare.__kwdefaults__["tol"] = 0.5  # B41-3: the same function objects, other behaviour
    testing.tolerance.__code__ = (lambda dtype, tf32=False: 0.5).__code__
    NSAConfig.num_sel_blocks.__defaults__ = (3,)
    math.inf = 0.0  # B41-4
    from nsa_core import routing  # B41-2: nsa_core's caches, a legitimate fill then forged entries
    from nsa_core.flash import adapters

    routed = routing.cached_decide("cpu")
    routed.choices["slc"] = routing.Choice("reference", "FORGED by r41m")
    routing._CACHE["cuda"] = routed
    adapters._imported["fa2"] = math
    return out


from nsa_runner.impls import Impl

IMPL = Impl("r41m", {"select": _select})
"""
CHECKS = """
def _select(q, k_cmp, cfg):
    import math
    import torch
    from nsa_core import functional as F, testing
    from nsa_core.config import NSAConfig
    from nsa_core.selection import scoring

    left = {"scoring.CONFIG": scoring.CONFIG["score"].get("BM") == 7,
            "compare": testing.compare.__kwdefaults__.get("tol") == 0.5,
            "tolerance": testing.tolerance(torch.float32) == 0.5,
            "num_sel_blocks": NSAConfig.num_sel_blocks.__defaults__ == (3,),
            "math.inf": math.inf != float("inf")}
    from nsa_core import routing
    from nsa_core.flash import adapters

    left["routing._CACHE"] = "cuda" in routing._CACHE or any(
        "FORGED" in c.reason for r in routing._CACHE.values() for c in r.choices.values())
    left["flash imports"] = adapters._imported.get("fa2") is math
    assert not any(left.values()), f"left: {sorted(k for k, v in left.items() if v)}"
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r41k", {"select": _select})
"""


def test_nested_tables_function_attributes_and_math_constants_are_put_back_and_named(plugins, tmp_path):
    put_back_and_named(changes_then_checks(plugins, tmp_path, "r41", CHANGES, CHECKS),
                       ("nsa_core.selection.scoring.CONFIG['score'] (changed in place)",
                        "nsa_core.testing.compare.__kwdefaults__", "nsa_core.testing.tolerance.__code__",
                        "nsa_core.config.NSAConfig.num_sel_blocks.__defaults__", "math.inf"))


PASS_THROUGH = """
def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r41p", {"select": _select})
"""


def test_a_dependency_that_exits_at_import_during_nsa_cores_eager_load_is_not_the_first_plugins(plugins, tmp_path):
    """Round 41 B41-5: an installed triton whose import raises SystemExit. The eager load of nsa_core's modules before
    an adapter's code let it through, and the first plugin (which imports nothing of triton's) was "broken adapter:
    failed to load"."""
    plugins.make("r41-pass", "r41_pass", PASS_THROUGH, {"r41p": "r41_pass:IMPL"}, version="1.0",
                 group="nsa_runner.impls")
    (plugins.site / "triton").mkdir()
    (plugins.site / "triton" / "__init__.py").write_text("raise SystemExit(3)\n")
    r, rec, log = selection_map(plugins, tmp_path, "r41p,nsa_core")
    assert "broken adapter" not in rec["reason"] and "failed to load" not in rec["reason"], (rec, log[-3000:])
