"""How nsa-run starts a Python child of its own (worker, spare, watchdog, plugin discovery, a measure's
child): ``python_m``, and how much such a child may print (``OUTPUT_CAP``)."""

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


# what a child of nsa-run's that runs plugin code (the discovery child, env-pairing's flash probe) may print before it
# is stopped: its output goes to a file in TMPDIR, and a plugin or flash package printing without end at its import
# filled the disk (round 24 B24-5: 2.78 GB; U24-5)
OUTPUT_CAP = 64 << 20


def flooded(what: str) -> str:
    """Why such a child was stopped at ``OUTPUT_CAP``: "its import printed more than 64 MiB (without end?); stopped"."""
    return f"{what} printed more than {OUTPUT_CAP >> 20} MiB (without end?); stopped"
