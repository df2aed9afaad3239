"""How nsa-run starts a Python child of its own (worker, spare, watchdog, plugin discovery, a measure's
child): ``python_m``."""

from __future__ import annotations

import sys


def python_m(module: str, *args: str) -> list[str]:
    """The command line of ``python -m MODULE ARGS`` with neither the working directory nor any script's
    folder on ``sys.path`` (``-P``; before 3.11 that first entry is dropped before anything is imported):
    a stage may plant an ``nsa_runner/`` package in the run folder, a worker's working directory, and
    every later worker imported it (round 16 A10). The venv's site-packages and PYTHONPATH stay."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", module, *args]
    return [sys.executable, "-c", "import sys; del sys.path[0]; import runpy; m = sys.argv.pop(1); "
            "runpy.run_module(m, run_name='__main__', alter_sys=True)", module, *args]


def python_c(code: str, *args: str) -> list[str]:
    """The command line of ``python -c CODE ARGS`` with the working directory not on ``sys.path`` (as
    ``python_m``): a probe run from a stage (cwd = the run folder) imported a planted ``json.py``."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-c", code, *args]
    return [sys.executable, "-c", "import sys; del sys.path[0]\n" + code, *args]
