"""Bad days, red-team round 42 B42-1 / B42-2, through the CLI.

B42-1: round 40's eager load of every nsa_core module (before the first adapter call) imported triton in a stage
process that never needed it: a triton install whose import exits or segfaults killed selection-map for an adapter that
uses nsa_core's float64 reference only ("process exited with code 0 without a result", nothing named). Expected: nsa-run
imports none of nsa_core's modules ahead of the adapter (one first loaded during an adapter's call is copied as soon as
its code has run, ``impls._NsaCoreLoads``); the adapter's verdict stands.

B42-2: a plain sanity run printed "an implementation's code left torch's random generator state changed": the stage's
own module check seeded torch's global generator inside the guard; U42-1: and "warnings.filters changed", sympy's own
filter for its own warning class, added by torch's lazy import of it during nsa_core's backward. Expected: no put-back
note in a run of nsa_core alone."""

from __future__ import annotations

import subprocess

try:
    from _bad_days import cli_cmd, manifest, selection_map
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, manifest, selection_map

REFERENCE_ONLY = """
def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    return F.select_blocks(q, k_cmp, cfg, backend="reference")


from nsa_runner.impls import Impl

IMPL = Impl("r42p", {"select": _select})
"""


def test_nsa_run_imports_no_triton_a_stage_never_needed(plugins, tmp_path):
    plugins.make("r42-pass", "r42_pass", REFERENCE_ONLY, {"r42p": "r42_pass:IMPL"}, version="1.0",
                 group="nsa_runner.impls")
    (plugins.site / "triton").mkdir()
    (plugins.site / "triton" / "__init__.py").write_text("import ctypes\nctypes.string_at(0)\n")  # a segfault
    r, rec, log = selection_map(plugins, tmp_path, "r42p")
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:], log[-3000:])


def test_a_sanity_run_of_nsa_core_alone_names_no_put_back(tmp_path):
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("stage", "sanity", "--out", out, "--device", "cpu"), capture_output=True, text=True,
                       timeout=900)
    (rec,) = manifest(out)["stages"]
    log = (out / "testrun" / "logs" / "sanity.log").read_text(errors="replace")
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:], log[-3000:])
    assert "note: an implementation's code left" not in log, log[-3000:]  # its RNG; sympy's filter (U42-1)


def test_what_torch_and_triton_set_for_themselves_on_the_gpu_is_kept_and_not_named(monkeypatch, capsys):
    """The plain GPU oneshot's logs (stop 39, H100) named inductor's cache variables and triton's newest launcher
    module as "an implementation's code left ... changed" where only nsa_core ran; the put-back undid them."""
    import os
    import sys
    import types

    from nsa_runner.impls import adapter_code

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setitem(sys.modules, "__triton_launcher", types.ModuleType("__triton_launcher"))
    newest = types.ModuleType("__triton_launcher")
    with adapter_code():
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = "/tmp/torchinductor_x"
        sys.modules["__triton_launcher"] = newest
    try:
        assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") == "/tmp/torchinductor_x"
        assert sys.modules["__triton_launcher"] is newest
        assert "note:" not in capsys.readouterr().err
    finally:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)


RELOADS = """
import importlib

ORIG = {}


def _select(q, k_cmp, cfg):
    import nsa_core.config as C
    import nsa_core.functional as F

    ORIG.setdefault("cls", C.NSAConfig)
    ORIG.setdefault("sel", F.select_blocks)
    importlib.reload(C)  # a careless hot-reload of modules loaded before its call
    importlib.reload(F)
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r43m", {"select": _select})
"""
RELOAD_CHECKS = """
import sys


def _select(q, k_cmp, cfg):
    import nsa_core.config as C
    import nsa_core.functional as F

    orig = sys.modules["r43_changes"].ORIG
    left = {"NSAConfig": C.NSAConfig is not orig["cls"], "select_blocks": F.select_blocks is not orig["sel"],
            "isinstance": not isinstance(cfg, C.NSAConfig)}
    assert not any(left.values()), f"left: {sorted(k for k, v in left.items() if v)}"
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r43k", {"select": _select})
"""


def test_a_reload_of_an_nsa_core_module_loaded_before_the_call_is_put_back(plugins, tmp_path):
    """Round 43 B43-2 (found after the stop's CI): ``importlib.reload(nsa_core.config)`` in an adapter's call ran
    through the recorder of modules loaded meanwhile, whose copy (the reload's) was put back last: the reload's
    NSAConfig and select_blocks stayed while the note said "put back"."""
    from _bad_days import changes_then_checks, put_back_and_named

    put_back_and_named(changes_then_checks(plugins, tmp_path, "r43", RELOADS, RELOAD_CHECKS),
                       ("of nsa_core.config's attributes", "of nsa_core.functional's attributes"))
