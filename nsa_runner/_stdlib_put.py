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
  Only callables: a module's data (``tempfile.tempdir``) is the program's to set;
- the **classes** whose methods nsa-run's result writing calls: pathlib's, json's encoder and decoder, ``enum.Enum``
  (round 25 B25-1: a forgotten ``mock.patch.object(Path, "mkdir", ...).start()``, or ``JSONEncoder.encode``
  returning bytes, lost a stage's PASS). Every attribute of the class itself; one a plugin added that hides a base
  class's attribute (a patch of an inherited method) is taken away again.

- the **import system's state**, ``sys.path``, ``sys.meta_path``, ``sys.path_hooks``, ``sys.path_importer_cache``
  (``import_state``; round 29 B29-1: None cached for every folder after a plugin emptied the path hooks; round 26
  U26-1: a stage or adapter that took the standard library's folder off ``sys.path``, or left a finder raising for
  every name, made nsa-run's next import of its own fail: "No module named 'platform'", the PASS lost).

A name the plugin code added to a module is kept (a library's, e.g. gettext's ``_``, used later). Cheap when nothing
changed (identity checks in C: it runs after every adapter call). Standard library only."""

from __future__ import annotations

import builtins
import cmath
import enum
import io
import json
import json.decoder
import json.encoder
import json.scanner
import math
import operator
import os
import pathlib
import pickle
import posixpath
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import types
import warnings

MODULES = (builtins, os, posixpath, json, json.encoder, json.decoder, json.scanner, io, pickle, shutil, signal,
           subprocess, tempfile, time, traceback)  # json's submodules: json.dumps looks up their functions at each
# call (round 26 B26-1: encode_basestring_ascii returning bytes, or _make_iterencode rebound, lost a PASS)
CLASSES = (pathlib.PurePath, pathlib.PurePosixPath, pathlib.Path, pathlib.PosixPath, json.JSONEncoder,
           json.JSONDecoder, enum.Enum)


# put back by tables of their own (``impls._interpreter_settings``): their hooks are settings, not functions
_OWN_TABLES = frozenset({"sys", "warnings", "logging", "threading", "faulthandler", "gc", "decimal", "locale"})


def loaded() -> tuple:
    """``MODULES`` and every other standard-library module loaded now (round 33: an adapter rebinding
    ``bisect.bisect_left`` or ``functools.reduce``, which MODULES did not list, changed nsa-run's and the next
    adapter's results). Never raises."""
    names = getattr(sys, "stdlib_module_names", frozenset())
    seen = {id(m) for m in MODULES}
    out = list(MODULES)
    try:
        for name, m in list(sys.modules.items()):
            top = name.partition(".")[0]
            if type(m) is type(sys) and top in names and top not in _OWN_TABLES and id(m) not in seen:
                seen.add(id(m))
                out.append(m)
    except Exception:  # noqa: BLE001 - a sys.modules the code replaced: MODULES only
        return MODULES
    return tuple(out)


_HEAP, _IMMUTABLE = 1 << 9, 1 << 8  # Py_TPFLAGS_HEAPTYPE, Py_TPFLAGS_IMMUTABLETYPE: a class whose attributes can be set


def loaded_classes(modules: tuple) -> tuple:
    """``CLASSES`` and every class defined in ``modules`` (as ``loaded`` gives them) whose attributes can be set
    (round 34 B34-3: ``csv.DictWriter.writerow`` rebound). Never raises."""
    seen = {id(c) for c in CLASSES}
    return CLASSES + tuple(c for c in classes_of(modules) if id(c) not in seen)


def classes_of(modules) -> list:
    """Every class defined in ``modules`` whose attributes can be set (a heap type, not immutable), each once; looked
    for once per module (this runs before every adapter call). Never raises."""
    seen: set[int] = set()
    out = []
    for m in modules:
        hit = _CLASSES_OF.get(id(m))
        if hit is None or hit[0] is not m:
            found = []
            try:
                with warnings.catch_warnings():  # (a deprecated name a module keeps, torch.distributed.reduce_op,
                    warnings.simplefilter("ignore")  # warns when its class is asked for)
                    name = m.__name__
                    found = [v for v in list(vars(m).values()) if isinstance(v, type) and v.__module__ == name
                             and v.__flags__ & _HEAP and not v.__flags__ & _IMMUTABLE]
            except Exception:  # noqa: BLE001 - an odd module: its classes left out
                pass
            hit = _CLASSES_OF[id(m)] = (m, found)
        for v in hit[1]:
            if id(v) not in seen:
                seen.add(id(v))
                out.append(v)
    return out


_CLASSES_OF: dict[int, tuple] = {}  # id(module) -> (the module, its classes): ``classes_of``' memory


def snapshot_loaded() -> list[tuple[object, dict]]:
    """``snapshot`` of every loaded standard-library module and their classes' functions (``loaded``,
    ``loaded_classes``)."""
    mods = loaded()
    return snapshot(mods, loaded_classes(mods))


def snapshot(modules=MODULES, classes=CLASSES) -> list[tuple[object, dict]]:
    """The names of each module and class as they are now."""
    return [(o, vars(o).copy()) for o in (*modules, *classes)]  # (a class's mappingproxy copies its dict: fast)


def over_builtin(module, key) -> bool:
    """Is ``key``, a name added to ``module``, one of builtins' (not a dunder)? Every function of that module then finds
    it instead of the builtin (round 37 B37-1..B37-3: ``min`` added to nsa_core's selection reference, ``len`` to
    torch.functional, ``isinstance`` to json.encoder). Not a submodule the import system bound there
    (``encodings.ascii``, loaded by a library's import on the GPU). Never raises."""
    try:
        if not isinstance(key, str) or key.startswith("__") or key not in vars(builtins):
            return False
        value = vars(module).get(key)
        return not (isinstance(value, types.ModuleType) and value.__name__ == f"{module.__name__}.{key}")
    except Exception:  # noqa: BLE001 - a hostile module: taken away
        return True


_CONSTANTS = (math, cmath)


def _same(now, before: dict) -> bool:
    """The same names in the same order, each bound to the very same object (no plugin's ``__eq__`` runs)."""
    return (len(now) == len(before) and all(map(operator.is_, now, before))
            and all(map(operator.is_, now.values(), before.values())))


def changed(saved: list[tuple[object, dict]]) -> list[tuple[object, str]]:
    """(module or class, name) for each name of ``saved`` rebound or deleted since (a module's callables only; every
    name of builtins and of a class), and each name added to a class that hides a base class's. Never raises."""
    out = []
    for owner, before in saved:
        try:
            now = vars(owner)
            if _same(now, before):
                continue
            # every name of builtins and of CLASSES; a function of any other module or class (a class's data may
            # change by design: weakref.finalize._dirty)
            # and every name of math / cmath: constants, no settings (round 41 B41-4: ``math.inf = 0.0`` made
            # nsa_core's compare call a wrong output ok against an all-zero reference)
            whole = owner is builtins or owner in CLASSES or owner in _CONSTANTS
            out += [(owner, k) for k, v in before.items()
                    if (whole or callable(v)) and now.get(k, changed) is not v]
            if whole and isinstance(owner, type):
                bases = owner.__mro__[1:]
                out += [(owner, k) for k in list(now) if k not in before and any(k in vars(b) for b in bases)]
            elif not isinstance(owner, type) and owner is not builtins:
                out += [(owner, k) for k in list(now) if k not in before and over_builtin(owner, k)]
        except Exception:  # noqa: BLE001 - one whose names cannot be read is left as it is
            continue
    return out


def names(which: list[tuple[object, str]], saved: list[tuple[object, dict]] = ()) -> list[str]:
    """``changed``'s pairs as text: ``json.dumps``, ``builtins.ascii (deleted)``, ``pathlib.Path.mkdir``,
    ``json.encoder.isinstance (added)`` (a name not in ``saved``'s copy of its owner). Never raises."""
    before = {id(o): b for o, b in saved}
    out = []
    for owner, k in which:
        if k not in before.get(id(owner), (k,)):
            out.append(f"{names([(owner, k)])[0]} (added)")
            continue
        try:
            where = (f"{owner.__module__}.{owner.__qualname__}" if isinstance(owner, type)
                     else getattr(owner, "__name__", "?"))
            name = f"{where}.{k}"
            name = name if len(name) <= 80 else name[:79] + "…"
            out.append(name + ("" if k in vars(owner) else " (deleted)"))
        except Exception:  # noqa: BLE001
            out.append("?")
    return out


def put_back(saved: list[tuple[object, dict]]) -> list[str]:
    """What ``changed`` finds, put back (a name added to a class, taken away); returns it as ``names`` writes it (as
    it was before the put-back). Never raises."""
    which = changed(saved)
    said = names(which, saved)
    before = {id(o): b for o, b in saved}
    for owner, k in which:
        try:
            was = before[id(owner)]
            if isinstance(owner, type):
                if k in was:
                    setattr(owner, k, was[k])
                else:
                    delattr(owner, k)
            elif k in was:
                vars(owner)[k] = was[k]
            else:  # a name added over a builtin's
                vars(owner).pop(k, None)
        except Exception:  # noqa: BLE001 - what cannot be put back stays as the plugin left it
            continue
    return said


def limits() -> dict[str, tuple[int, int]]:
    """Every resource limit of the process, by name (``RLIMIT_FSIZE``)."""
    out = {}
    for name in sorted(n for n in dir(resource) if n.startswith("RLIMIT_")):
        try:
            out[name] = resource.getrlimit(getattr(resource, name))
        except (OSError, ValueError):
            continue
    return out


def put_back_limits(saved: dict[str, tuple[int, int]]) -> list[str]:
    """The resource limits changed since ``saved`` (``limits``) put back where the process may: a lowered hard limit
    comes back only for root. Returns each changed one by name, ``resource.RLIMIT_AS``, with "(lowered to (s, h);
    could not be raised back: the process may not)" where it stayed. Never raises."""
    said = []
    for name, was in saved.items():
        try:
            now = resource.getrlimit(getattr(resource, name))
            if now == was:
                continue
            try:
                resource.setrlimit(getattr(resource, name), was)
            except (OSError, ValueError):
                pass
            stayed = resource.getrlimit(getattr(resource, name)) != was
            said.append(f"resource.{name}" + (f" (lowered to {now}; could not be raised back: the process may not)"
                                               if stayed else ""))
        except (OSError, ValueError):
            continue
    return said


def c_environ() -> dict[bytes, bytes] | None:
    """The C environment (``environ``: what ``getenv``, C libraries and a child started with ``env=None`` read), which
    ``os.putenv`` / ``os.unsetenv`` change behind ``os.environ``'s back; None where it cannot be read."""
    try:
        import ctypes

        env = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
        out: dict[bytes, bytes] = {}
        i = 0
        while env[i] is not None:
            k, _, v = env[i].partition(b"=")
            out.setdefault(k, v)
            i += 1
        return out
    except Exception:  # noqa: BLE001 - no libc symbol: nothing to compare
        return None


def put_back_c_environ(saved: dict[bytes, bytes] | None) -> list[str]:
    """After ``os.environ``'s own put back: the C environment made to agree with it, and, for names ``os.environ``
    does not hold, made as it was in ``saved`` (``c_environ`` before the code ran). ``os.putenv`` / ``os.unsetenv``
    change it behind ``os.environ``'s back (round 30 B30-1: ``os.unsetenv("PATH")`` left a child started by the stage
    with no PATH; round 31 B31-4: ``os.putenv("TZ", ...)`` left every later ``tzset`` 5:30 off). Returns "the C
    environment (NAME, ...)" where it put something back. Never raises."""
    c = c_environ()
    if c is None:
        return []
    fixed = []
    try:
        want = {os.fsencode(k): os.fsencode(v) for k, v in dict(os.environ).items()}
    except Exception:  # noqa: BLE001 - an os.environ that cannot be read: os.environ's put back says so
        return []
    for kb in sorted(set(c) | set(want) | set(saved or {})):
        goal = want[kb] if kb in want else c.get(kb) if saved is None else saved.get(kb)
        if c.get(kb) == goal:
            continue
        try:
            if goal is None:
                os.unsetenv(kb)
            else:
                os.putenv(kb, goal)
            fixed.append(os.fsdecode(kb))
        except (OSError, ValueError):
            continue
    return [f"the C environment ({', '.join(x[:60] for x in fixed[:5])}"
            f"{f' and {len(fixed) - 5} more' if len(fixed) > 5 else ''}: os.unsetenv / os.putenv)"] if fixed else []


def time_zone() -> tuple:
    """What ``time.tzset`` last read (the names, offsets and daylight flag)."""
    return (time.tzname, time.timezone, time.altzone, time.daylight)


def put_back_time_zone(saved: tuple) -> list[str]:
    """``time.tzset`` again where the zone differs from ``saved`` (``time_zone``), after ``os.environ``'s TZ was put
    back (round 30 B30-1: an adapter's ``TZ=Asia/Kolkata`` + ``tzset`` left every later local time 5:30 off, after
    its TZ itself had been put back). Never raises."""
    try:
        if time_zone() == saved:
            return []
        time.tzset()
        return ["the time zone (time.tzset)" if time_zone() == saved else
                "the time zone (time.tzset; could not be put back: the environment's TZ reads another zone)"]
    except Exception:  # noqa: BLE001
        return []


IMPORT_LISTS = ("path", "meta_path", "path_hooks")


def import_state() -> dict[str, tuple[object, list | dict]]:
    """``sys.path``, ``sys.meta_path`` and ``sys.path_hooks`` as they are now (each list object and its entries), and
    ``sys.path_importer_cache`` (the dict and a copy)."""
    out: dict[str, tuple[object, list | dict]] = {n: (getattr(sys, n), list(getattr(sys, n))) for n in IMPORT_LISTS}
    out["path_importer_cache"] = (sys.path_importer_cache, dict(sys.path_importer_cache))
    return out


def _put_back_cache(obj: dict, saved: dict, keep_added: bool) -> bool:
    """``sys.path_importer_cache`` the same dict again, each saved folder's finder as saved; an entry added since kept
    (``keep_added``) unless it is None, "no finder for this folder", which a plugin emptying ``sys.path_hooks`` for a
    moment left for every folder (round 29 B29-1: nsa-run's next import of its own failed, "No module named
    'platform'"; a None is only looked up again). True when a saved folder's finder was taken away or made None."""
    if sys.path_importer_cache is not obj:
        sys.path_importer_cache = obj
    now = dict(obj)
    for k in now:
        if k not in saved and (not keep_added or now[k] is None):
            del obj[k]
    if any(now.get(k, _MISSING) is not v for k, v in saved.items()):
        obj.update(saved)  # (a finder made again for a folder, after a clear(), is as good: put back unsaid)
    return any(v is not None and now.get(k) is None for k, v in saved.items())


_MISSING = object()


def _entry(x: object, y: object) -> bool:
    """The same entry: the same object, or equal plain strings (never a plugin object's ``__eq__``)."""
    return x is y or (type(x) is str and type(y) is str and x == y)


def put_back_import_state(saved: dict[str, tuple[object, list]], keep_added: bool = True) -> list[str]:
    """Each of ``import_state``'s lists the same list object again, holding its saved entries in their order, then,
    ``keep_added``, the entries added since: a library registers its import hook or its folder once, at its import,
    and stays in ``sys.modules``; taking the entry away broke the next plugin using it (round 20 B20-4: six's
    meta-path importer). What was removed or moved is put back in front: no plugin code takes away or shadows what
    nsa-run or the next plugin finds. Without ``keep_added``, exactly as saved (the stage's worker once the stage has
    ended: none of its code imports again). Returns the names of those whose saved entries were replaced, taken away
or moved (``sys.meta_path``). Never raises."""
    said = []
    for name, (obj, items) in saved.items():
        try:
            if name == "path_importer_cache":
                if _put_back_cache(obj, items, keep_added):
                    said.append("sys.path_importer_cache")
                continue
            current = getattr(sys, name, None)
            now = list(current) if isinstance(current, list) else []
            added = [x for x in now if not any(_entry(x, y) for y in items)] if keep_added else []
            want = items + added
            if current is obj and len(now) == len(want) and all(map(_entry, now, want)):
                continue
            kept = [x for x in now if any(_entry(x, y) for y in items)]
            if current is not obj or len(kept) != len(items) or not all(map(_entry, kept, items)):
                said.append(f"sys.{name}")  # (an entry only added, kept or taken away again, is not news)
            if current is not obj:
                setattr(sys, name, obj)
            obj[:] = want
        except Exception:  # noqa: BLE001 - one that cannot be put back is left as the plugin code left it
            continue
    return said
