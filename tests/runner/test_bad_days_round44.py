"""Bad days, red-team round 44, through the CLI.

B44-1: an adapter that popped ``nsa_core.config`` from ``sys.modules`` and imported it again (or bound a fresh copy
of it on the package) left the package's attribute ``nsa_core.config`` naming its copy: ``sys.modules`` was put back,
the attribute was not, and the next adapter's ``import nsa_core.config`` got another ``NSAConfig``
(``isinstance(cfg, NSAConfig)`` failed, blamed on it). Expected: put back and named.

B44-2 / B44-3: a triton whose import calls ``sys.exit`` or that has no ``triton.jit`` (a stub, a partial install)
made nsa_core's CPU paths FAIL in sanity and selection-map, and triton-fwd ERROR or FAIL naming no triton. Expected:
the CPU paths PASS as without triton; triton-fwd SKIPs naming triton's problem."""

from __future__ import annotations

import subprocess

import pytest

try:
    from _bad_days import changes_then_checks, cli_cmd, manifest, put_back_and_named
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import changes_then_checks, cli_cmd, manifest, put_back_and_named

FRESH_COPIES = """
import importlib.util
import sys

ORIG = {}


def _select(q, k_cmp, cfg):
    import nsa_core
    import nsa_core.config
    import nsa_core.functional as F

    ORIG.setdefault("cls", nsa_core.config.NSAConfig)
    ORIG.setdefault("testing", __import__("nsa_core.testing").testing)
    sys.modules.pop("nsa_core.config")  # a careless "fresh import" of a module loaded before the call
    import nsa_core.config  # noqa: F811
    spec = importlib.util.spec_from_file_location("nsa_core.testing", ORIG["testing"].__file__)
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    nsa_core.testing = fresh  # a fresh copy bound on the package only
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r45m", {"select": _select})
"""
CHECKS = """
import sys


def _select(q, k_cmp, cfg):
    import nsa_core.config as C
    import nsa_core.functional as F
    from nsa_core import testing

    orig = sys.modules["r45_changes"].ORIG
    left = {"NSAConfig": C.NSAConfig is not orig["cls"], "isinstance": not isinstance(cfg, C.NSAConfig),
            "testing": testing is not orig["testing"]}
    assert not any(left.values()), f"left: {sorted(k for k, v in left.items() if v)}"
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r45k", {"select": _select})
"""


def test_an_nsa_core_packages_submodule_attribute_is_put_back_and_named(plugins, tmp_path):
    put_back_and_named(changes_then_checks(plugins, tmp_path, "r45", FRESH_COPIES, CHECKS),
                       ("nsa_core.config", "nsa_core.testing"))


@pytest.mark.parametrize(("init", "named"), [
    ("import sys\nsys.exit('triton: no CUDA driver found')\n", "triton fails to import (SystemExit: triton: no CUDA"),
    ("__version__ = '3.0.0'\n", "triton lacks triton.jit"),
], ids=["sys-exit", "no-jit"])
def test_a_triton_that_exits_at_import_or_lacks_its_api_leaves_the_cpu_paths_and_is_named(plugins, tmp_path, init,
                                                                                         named):
    (plugins.site / "triton" / "language").mkdir(parents=True)
    (plugins.site / "triton" / "__init__.py").write_text(init)
    (plugins.site / "triton" / "language" / "__init__.py").write_text("")
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("oneshot", "--only", "sanity,selection-map,triton-fwd", "--out", out, "--device", "cpu"),
                       env=plugins.env(), capture_output=True, text=True, timeout=900)
    got = {s["name"]: s for s in manifest(out)["stages"]}
    assert got["sanity"]["status"] == "PASS" and got["selection-map"]["status"] == "PASS", (got, r.stdout[-3000:])
    fwd = got["triton-fwd"]
    assert fwd["status"] == "SKIP" and named in fwd["reason"], fwd
