"""The standard library's functions as nsa-run's own code needs them, in a process that also runs plugin code (a
stage, a plugin's import, an adapter): taken before the plugin code, the rebound or deleted ones put back after it,
before nsa-run's code runs again (round 24 B24-2: a stage leaving an orjson-style ``json.dumps`` returning bytes, or
``os.replace`` mocked, made the worker's own result writing fail: its PASS recorded "exited without a result"; a
plugin's import doing the same was listed "ended the discovery process"). Only callables are put back (a module's
data, e.g. ``tempfile.tempdir``, is the program's to set); names the plugin code added are kept."""

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


def snapshot() -> list[tuple[object, dict]]:
    """Each module's callables as they are now."""
    return [(m, {k: v for k, v in vars(m).items() if callable(v)}) for m in MODULES]


def put_back(saved: list[tuple[object, dict]]) -> list[str]:
    """The callables of ``saved`` that were rebound or deleted since, put back; returns their names
    (``json.dumps``). Never raises."""
    changed = []
    for module, before in saved:
        try:
            now = vars(module)
            for name, value in before.items():
                if now.get(name, put_back) is not value:
                    now[name] = value
                    changed.append(f"{getattr(module, '__name__', '?')}.{name}")
        except Exception:  # noqa: BLE001 - what cannot be put back stays as the plugin left it
            continue
    return changed
