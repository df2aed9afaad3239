"""Bad days, red-team round 44, through the CLI.

B44-1: an adapter that popped ``nsa_core.config`` from ``sys.modules`` and imported it again (or bound a fresh copy
of it on the package) left the package's attribute ``nsa_core.config`` naming its copy: ``sys.modules`` was put back,
the attribute was not, and the next adapter's ``import nsa_core.config`` got another ``NSAConfig``
(``isinstance(cfg, NSAConfig)`` failed, blamed on it). Expected: put back and named.

B44-2 / B44-3: a triton whose import calls ``sys.exit`` or that has no ``triton.jit`` (a stub, a partial install)
made nsa_core's CPU paths FAIL in sanity and selection-map, and triton-fwd ERROR or FAIL naming no triton. Expected:
the CPU paths PASS as without triton; triton-fwd SKIPs naming triton's problem. Round 45 added a triton whose lazily
loaded API raises (B45-1), one without ``triton.language`` (B45-3) and an adapter importing nsa_core lazily (B45-2)."""

from __future__ import annotations

import subprocess
import sys

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


LAZY_API = """__version__ = "3.4.0"


def __getattr__(name):  # the API loaded lazily (PEP 562), and that load failing
    if name in ("jit", "cdiv", "next_power_of_2"):
        raise RuntimeError("0 active drivers ([]). There should only be one.")
    raise AttributeError(name)
"""


JIT = """__version__ = "3.4.0"


def jit(fn=None, **kw):  # present, but broken when applied
    {made}


def cdiv(a, b):
    return -(-a // b)


def next_power_of_2(n):
    return 1 << (n - 1).bit_length()
"""
LANGUAGE = """class constexpr:
    def __init__(self, v):
        self.value = v


def _f(*a, **k):
    pass


program_id = arange = load = store = dot = zeros = where = sum = max = exp = static_range = _f
"""


@pytest.mark.parametrize(("init", "language", "named"), [
    ('raise RuntimeError("libcuda.so.1: version mismatch")\n', True,  # round 43 B43-3: not only ImportError
     "triton fails to import (RuntimeError: libcuda.so.1"),
    ("import sys\nsys.exit('triton: no CUDA driver found')\n", True,
     "triton fails to import (SystemExit: triton: no CUDA"),
    ("__version__ = '3.0.0'\n", True, "triton lacks triton.jit"),
    (LAZY_API, True, "triton fails to import (RuntimeError: 0 active drivers"),  # round 45 B45-1
    ("__version__ = '3.0.0'\n", False,  # round 45 B45-3: was "triton is not installed"
     "(ModuleNotFoundError: No module named 'triton.language'"),
    ("__version__ = '3.4.0'\nfrom triton import _C_part\n", True,  # round 46 B46-2: the ImportError names "triton"
     "triton fails to import (ImportError: cannot import name '_C_part'"),
    (JIT.format(made='raise RuntimeError("unsupported AST node")'), True,  # round 46 B46-1
     "triton fails to import (RuntimeError: unsupported AST node"),
    (JIT.format(made="return 42"), True, "triton.jit makes no kernel (it returned int)"),
], ids=["runtime-error", "sys-exit", "no-jit", "lazy-api-raises", "no-language", "partial", "jit-raises",
        "jit-no-kernel"])
def test_a_triton_that_exits_at_import_or_lacks_its_api_leaves_the_cpu_paths_and_is_named(plugins, tmp_path, init,
                                                                                         language, named):
    (plugins.site / "triton").mkdir()
    (plugins.site / "triton" / "__init__.py").write_text(init)
    if language:
        (plugins.site / "triton" / "language").mkdir()
        (plugins.site / "triton" / "language" / "__init__.py").write_text(LANGUAGE if "def jit" in init else "")
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("oneshot", "--only", "sanity,selection-map,triton-fwd", "--out", out, "--device", "cpu"),
                       env=plugins.env(), capture_output=True, text=True, timeout=900)
    got = {s["name"]: s for s in manifest(out)["stages"]}
    assert got["sanity"]["status"] == "PASS" and got["selection-map"]["status"] == "PASS", (got, r.stdout[-3000:])
    fwd = got["triton-fwd"]
    assert fwd["status"] == "SKIP" and named in fwd["reason"], fwd


LAZY_ADAPTER = """
import importlib.util
import sys


def lazy(name):  # the importlib docs' LazyLoader recipe: the module's code runs on its first use
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


testing = lazy("nsa_core.testing")  # made at the adapter's import, first used in its call


def _select(q, k_cmp, cfg):
    import nsa_core.functional as F

    lazy("nsa_core.decode.labels")  # made in the call, never used
    assert testing.__name__ == "nsa_core.testing"
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r45lazy", {"select": _select})
"""


def test_an_adapter_importing_nsa_core_lazily_passes_with_no_note(plugins, tmp_path):
    """Round 45 B45-2: a module an adapter imported with ``importlib.util.LazyLoader`` (made through the recorder, its
    code run on first use) was unloaded after the call as loaded out of sight; its first use then failed ("module
    object ... substituted in sys.modules during a lazy load"), blamed on the adapter. Expected: PASS, no note."""
    from _bad_days import selection_map

    plugins.make("r45-lazy", "r45_lazy", LAZY_ADAPTER, {"r45lazy": "r45_lazy:IMPL"}, version="1.0",
                 group="nsa_runner.impls")
    r, rec, log = selection_map(plugins, tmp_path, "r45lazy,nsa_core")
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:], log[-3000:])
    assert "out of nsa-run's sight" not in log and "note: an implementation" not in log, log[-3000:]


def test_no_triton_module_at_all_is_not_installed():
    """Round 46 B46-2's other side: with no triton module, nsa_core says "triton is not installed" (and only then)."""
    r = subprocess.run([sys.executable, "-c", "import sys; sys.modules['triton'] = None\n"
                        "from nsa_core import _triton; print(_triton.PROBLEM, _triton.triton)"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "triton is not installed None", (r.stdout, r.stderr[-2000:])
