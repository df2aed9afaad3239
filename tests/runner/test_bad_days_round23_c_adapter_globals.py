"""Bad days, red-team round 23 (helper c) B23-4, through the CLI: an implementation's adapter that changes
process-global Python state ``impls.adapter_code`` did not put back broke the stage's own code, every
implementation's verdict lost (nsa_core's too), the adapter not named:

- ``matplotlib.rcParams["text.usetex"] = True`` (common in research code) at the adapter module's import or inside
  its ``select``: selection-map ERROR "latex could not be found" in the stage's own figure;
- ``builtins.print`` rebound to a function that raises, at its import or in ``select``: selection-map ERROR from the
  stage's own print of its check lines.

Expected: the builtins an adapter rebound or deleted are put back after its code (its import, which discovery.load
runs inside ``adapter_code``, and each call; a builtin it added is kept), matplotlib's rcParams too, a note in the
stage's log names them; nsa-run's own figures are drawn under matplotlib's default settings (``_figures.drawing``),
so a user's matplotlibrc with ``text.usetex: True`` (or an adapter whose import is matplotlib's first: nothing from
before to put back) does not break them either. A ``latex`` that always fails is put first on PATH, so the tests do
not depend on whether this machine has LaTeX.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN

ADAPTER = '''
import builtins
import os

from nsa_runner.impls import Impl

WHERE = os.environ["R23C_WHERE"]
_calls = [0]


def _quiet(*a, **k):  # the adapter's "quiet mode", installed process-wide
    raise RuntimeError("r23c quiet mode: print disabled")


def _house_style():
    import matplotlib

    matplotlib.rcParams["text.usetex"] = True  # the author's house style for figures
    builtins.print = _quiet
    del builtins.ascii  # a builtin deleted: put back too


if WHERE == "import":
    _house_style()


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    if _calls[0] and getattr(builtins, "r23c_added", None) is not True:
        raise RuntimeError("the builtin this adapter added was taken away")
    _calls[0] += 1
    builtins.r23c_added = True  # a name the adapter adds (a library's helper): kept
    if WHERE == "select":
        _house_style()
    return F.select_blocks(q, k_cmp, cfg)


IMPL = Impl("r23c", {"select": _select})
'''


def _env(plugins, tmp_path, **extra) -> dict[str, str]:
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    latex = fake / "latex"
    latex.write_text("#!/bin/sh\necho 'r23c: no latex here' >&2\nexit 1\n")
    latex.chmod(0o755)
    env = plugins.env() | extra
    env["PATH"] = f"{fake}{os.pathsep}{env.get('PATH', '')}"
    return env


def _selection_map(env, out, *impl) -> tuple[subprocess.CompletedProcess, dict, str]:
    args = ["stage", "selection-map", "--device", "cpu", "--out", str(out)]
    args += ["--impl", ",".join(impl)] if impl else []
    r = subprocess.run([sys.executable, "-c", MAIN, *args], env=env, text=True, capture_output=True, timeout=600)
    run = out / "testrun"
    m = json.loads((run / "manifest.json").read_text())
    rec = next(s for s in m["stages"] if s["name"] == "selection-map")
    return r, rec, (run / "logs" / "selection-map.log").read_text(errors="replace")


@pytest.mark.parametrize("where", ["import", "select"])
def test_builtins_and_rcparams_an_adapter_left_are_put_back(plugins, tmp_path, where):
    plugins.make("r23c-adapter", "r23c_adapter", ADAPTER, {"r23c": "r23c_adapter:IMPL"}, version="1.0",
                 group="nsa_runner.impls")
    out = tmp_path / "runs"
    r, rec, log = _selection_map(_env(plugins, tmp_path, R23C_WHERE=where), out, "r23c", "nsa_core")
    # before: ERROR "RuntimeError: r23c quiet mode: print disabled" (the stage's own print), or "latex ... " in its
    # own figure; selection_map.txt / selection.png not written
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:], log[-3000:])
    run = out / "testrun"
    assert (run / "selection.png").stat().st_size > 0
    text = (run / "selection_map.txt").read_text()
    for name in ("r23c", "nsa_core"):  # every check of both, in the runner's own state (the added builtin kept)
        lines = [line for line in text.splitlines() if line.strip().startswith("[") and f"] {name}:" in line]
        assert lines and all(line.strip().startswith("[ok]") for line in lines), text
    note = [line for line in log.splitlines() if line.startswith("note: an implementation's code left")]
    assert any("builtins.print" in line and "builtins.ascii (deleted)" in line and "text.usetex" in line
               for line in note), (note, log[-3000:])
    assert not any("r23c_added" in line for line in note), note


def test_stage_figure_is_drawn_under_matplotlibs_defaults(plugins, tmp_path):
    rc = tmp_path / "matplotlibrc"
    rc.write_text("text.usetex: True\n")  # a user's own matplotlibrc (here, or read at an adapter's first import)
    out = tmp_path / "runs"
    r, rec, log = _selection_map(_env(plugins, tmp_path, MATPLOTLIBRC=str(rc)), out)
    # before: ERROR in the stage's own figure (usetex from the matplotlibrc: the failing latex)
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:], log[-3000:])
    assert (out / "testrun" / "selection.png").stat().st_size > 0
