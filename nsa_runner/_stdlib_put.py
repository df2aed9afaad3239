"""Process-global functions as nsa-run's own code needs them, in a process that also runs plugin code (a stage, a
plugin's import, an adapter, a flash package's import): taken before the plugin code, the rebound or deleted ones put
back after it, before nsa-run's code runs again. The one mechanism for it, used by the stage's worker, the discovery
child, ``impls.adapter_code`` and env-pairing's flash probe (which loads this file by its path: it imports neither
nsa_runner nor torch).

- **builtins**, whole (round 22 B22-3: an import wrapping ``builtins.__import__`` to raise for ``time`` got the
  next, healthy plugin listed broken; round 23 B23-4: an adapter rebinding ``builtins.print`` lost every verdict);
- the **standard library's functions** nsa-run's code calls (round 24 B24-2: a stage leaving an orjson-style
  ``json.dumps`` returning bytes, or ``os.replace`` mocked, made the worker's own result writing fail: its PASS
  recorded "exited without a result"; a plugin's import doing the same was listed "ended the discovery process").
  Only callables: a module's data (``tempfile.tempdir``) is the program's to set.

A name the plugin code added is kept (a library's, e.g. gettext's ``_``, used later). Standard library only."""

from __future__ import annotations

import builtins
import io
import json
import os
import pickle
import posixpath
import shutil
import signal
import subprocess
import tempfile
import time
import traceback

MODULES = (builtins, os, posixpath, json, io, pickle, shutil, signal, subprocess, tempfile, time, traceback)


def snapshot(modules=MODULES) -> list[tuple[object, dict]]:
    """Each module's names as they are now: every name of builtins, the callables of the others."""
    return [(m, dict(vars(m)) if m is builtins else {k: v for k, v in vars(m).items() if callable(v)})
            for m in modules]


def changed(saved: list[tuple[object, dict]]) -> list[tuple[object, str]]:
    """(module, name) for each name of ``saved`` rebound or deleted since (compared by identity: no plugin's
    ``__eq__`` runs). Never raises."""
    out = []
    for module, before in saved:
        try:
            now = vars(module)
            out += [(module, k) for k, v in before.items() if now.get(k, changed) is not v]
        except Exception:  # noqa: BLE001 - a module whose names cannot be read is left as it is
            continue
    return out


def names(which: list[tuple[object, str]]) -> list[str]:
    """``changed``'s pairs as text: ``json.dumps``, ``builtins.ascii (deleted)``. Never raises."""
    out = []
    for module, k in which:
        try:
            name = f"{getattr(module, '__name__', '?')}.{k}"
            name = name if len(name) <= 80 else name[:79] + "…"
            out.append(name + ("" if k in vars(module) else " (deleted)"))
        except Exception:  # noqa: BLE001
            out.append("?")
    return out


def put_back(saved: list[tuple[object, dict]]) -> list[str]:
    """The names of ``saved`` rebound or deleted since, put back; returns them as ``names`` writes them (as they
    were before the put-back: ``(deleted)`` where one was). Never raises."""
    which = changed(saved)
    said = names(which)
    before = {id(m): b for m, b in saved}
    for module, k in which:
        try:
            vars(module)[k] = before[id(module)][k]
        except Exception:  # noqa: BLE001 - what cannot be put back stays as the plugin left it
            continue
    return said
