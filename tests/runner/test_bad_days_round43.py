"""Bad days, red-team round 43 B43-1, through the CLI.

An adapter that put its own import hook in front of ``sys.meta_path`` (as typeguard, jaxtyping or beartype's claw do)
took the import of an nsa_core module away from the recorder of modules loaded during its call
(``impls._NsaCoreLoads``): ``nsa_core.testing``, first loaded in that call, had ``TOLERANCES[fp32]`` loosened to 0.5,
the next adapter was judged with it, and nothing was named. Expected: an nsa_core module that loaded during the call out
of the recorder's sight is unloaded after it (the next import loads it afresh) and named."""

from __future__ import annotations

try:
    from _bad_days import changes_then_checks, put_back_and_named
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import changes_then_checks, put_back_and_named

HOOKED = """
import importlib.machinery
import sys

ORIG = {}


class _Claw:  # an import hook in front of every other finder, as typeguard's / beartype's claw install
    def find_spec(self, name, path=None, target=None):
        if not name.startswith("nsa_core."):
            return None
        return importlib.machinery.PathFinder.find_spec(name, path, target)


def _select(q, k_cmp, cfg):
    import torch
    from nsa_core import functional as F

    sys.meta_path.insert(0, _Claw())
    from nsa_core import testing  # its first load in this process, through the claw

    ORIG["fp32"] = testing.TOLERANCES[torch.float32]
    testing.TOLERANCES[torch.float32] = 0.5
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r44m", {"select": _select})
"""
CHECKS = """
import sys


def _select(q, k_cmp, cfg):
    import torch
    from nsa_core import functional as F, testing

    orig = sys.modules["r44_changes"].ORIG
    assert testing.TOLERANCES[torch.float32] == orig["fp32"], f"left: TOLERANCES {testing.TOLERANCES[torch.float32]}"
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r44k", {"select": _select})
"""


def test_an_nsa_core_module_loaded_out_of_the_recorders_sight_is_unloaded_and_named(plugins, tmp_path):
    put_back_and_named(changes_then_checks(plugins, tmp_path, "r44", HOOKED, CHECKS),
                       ("nsa_core.testing (loaded out of nsa-run's sight",))
