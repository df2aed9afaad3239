"""Python bytecode for nsa-run's processes where the environment forbids writing it (issue 13).

Images that set ``PYTHONDONTWRITEBYTECODE=1`` (common in containers: no ``__pycache__`` in the image's
site-packages) and ship a package without its ``.pyc`` files make every process that imports it
compile its sources again. On the H100 image of 2026-11-25 that was torch's ``_dynamo`` / ``nn``
and FA-4's and fla's imports: 2.8 s of ``compile`` in each process importing torch, 4.4-6.5 s in
each importing FA-4, and a oneshot starts ~20 such processes (stages, spares, the flash child, the
parity children, the CLI itself).

``use_cache`` keeps the wish (nothing is written beside the sources) and drops the cost: the bytecode
goes to a per-user cache folder (``sys.pycache_prefix``, Python's own mirror tree; the children get it
as ``PYTHONPYCACHEPREFIX``). Only when the environment asked for no bytecode, the user has no prefix of
their own, ``NSA_RUN_PYCACHE`` is not ``0``, and the folder can be written (a prefix Python cannot write
would make every process compile every module: it reads bytecode only from there). The first run
fills it (a few seconds once); env.txt names it (``envinfo.python_info``).
"""

from __future__ import annotations

import os
import sys
import tempfile

ENV = "NSA_RUN_PYCACHE"  # 0: leave the environment's bytecode setting as it is


def cache_dir():
    from platformdirs import user_cache_path

    return user_cache_path("nsa-run", appauthor=False) / "pycache"


def use_cache() -> str | None:
    """Point this process and its children at the bytecode cache when the environment forbids
    writing bytecode; returns the folder, or None when nothing was changed."""
    from nsa_runner._text import env_switch

    try:
        if not env_switch(ENV, True):
            return None
    except ValueError:  # refused by the CLI in one line (``cli.main``); nothing changed here
        return None
    if os.environ.get("PYTHONDONTWRITEBYTECODE", "") == "" and not sys.flags.dont_write_bytecode:
        return None  # bytecode is written beside the sources, as Python does by default
    if sys.pycache_prefix or os.environ.get("PYTHONPYCACHEPREFIX"):
        return None  # the user's own prefix
    try:
        d = cache_dir()
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=d, prefix=".probe-"):
            pass  # writable (a read-only or full home: leave everything as it was)
    except Exception:  # noqa: BLE001 - platformdirs missing, no home, read-only, full: nothing changes
        return None
    sys.pycache_prefix = str(d)
    sys.dont_write_bytecode = False
    os.environ["PYTHONPYCACHEPREFIX"] = str(d)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    return str(d)
