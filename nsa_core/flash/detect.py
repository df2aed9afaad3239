"""Is flash-attn 2 / 3 / 4 really installed here? One answer for every caller.

``detect(path, do_import=True) -> dict`` for path ``"fa2"``, ``"fa3"`` or ``"fa4"``. Used by
``nsa_core.flash.adapters.status`` (routing, pick, fa2-probe's list of paths) and by the
env-pairing probe child (``nsa_runner.envinfo.probe_flash``, which loads this file by its path so
a broken nsa_core cannot hide the facts). Standard library only; ``do_import=False`` imports no
flash module (it only reads distribution metadata and locates modules).

Why a module name is not enough: the ``flash_attn`` package name is shared.

- flash-attn-4's wheel (4.0.0b36) installs only ``flash_attn/cute/`` (no ``flash_attn/__init__.py``):
  ``import flash_attn`` then succeeds as an empty namespace package although FA-2 is absent.
- flash-attn 2.8's wheel bundles an early ``flash_attn/cute`` (``__version__ = "0.1.0"``, another
  ``flash_attn_func`` signature) that is not FA-4.

So:
  FA-2 present = a regular ``flash_attn`` package (the ``flash-attn`` 2.x distribution, or a
      package on the path whose ``__version__`` is 2.x) that imports, its compiled extension
      ``flash_attn_2_cuda`` imports, and ``flash_attn.flash_attn_func`` / ``flash_attn_varlen_func``
      exist.
  FA-4 present = ``flash_attn.cute`` imports, its ``flash_attn_func`` takes ``return_lse`` (the
      adapter always passes it), and it is FA-4's: the ``flash-attn-4`` distribution (4.x) is
      installed, or, without it, the module is not flash-attn 2.x's bundled copy.
  FA-3 present = ``flash_attn_interface`` imports and has ``flash_attn_func``.

Record: ``{"path", "module", "what", "present", "not_installed", "version", "dist", "reason",
"error", "file"}``. ``present``: usable. ``not_installed``: absent, which is not a fault
(``reason`` says precisely what was found instead). Neither: installed but broken (``error``).
``reason`` is a phrase to put after the module or the label: ``f"{module} {reason}"``
("flash_attn absent (the `flash_attn` package here is FA-4's namespace: ...)"); ``summary(rec)``
gives the label form ("FA-2 absent (...)", "FA-4 ok (flash-attn-4 4.0.0b36)").
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
import inspect
import os
import re

MODULES = {"fa2": "flash_attn", "fa3": "flash_attn_interface", "fa4": "flash_attn.cute"}
WHAT = {"fa2": "FA-2", "fa3": "FA-3", "fa4": "FA-4"}
# distributions that provide each path (pip normalises - and _; flash_attn.cute.__version__ of
# FA-4 reads a distribution named "fa4" and says "0.0.0", so the version is the distribution's)
DISTS = {"fa2": ("flash-attn",), "fa3": ("flash-attn-3", "flashattn-hopper"),
         "fa4": ("flash-attn-4", "flash-attn-cute")}
FA2_EXTENSION = "flash_attn_2_cuda"
FA2_SYMBOLS = ("flash_attn_func", "flash_attn_varlen_func")
_CUTE_INIT = "flash_attn/cute/__init__.py"


_DIST_FILES = ("METADATA", "PKG-INFO", "RECORD", "direct_url.json")


def _distfiles():
    """nsa_core/_distfiles.py (the one safe reader of installed distributions' files), loaded from its file
    beside this one when it is not loaded yet: this file also runs loaded by its path, in env-pairing's
    probe child, where importing the nsa_core package may fail (``envinfo.probe_flash``)."""
    import importlib.util
    import sys

    name = "nsa_core._distfiles"
    mod = sys.modules.get(name)
    if mod is None:
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_distfiles.py")
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            sys.modules.pop(name, None)
            raise
    return mod


DIST_FILE_MAX = _distfiles().MAX_DIST_FILE_BYTES  # a dist-info file read for facts, at most


class UnreadableDistribution(OSError):
    """An installed distribution whose metadata files cannot be read safely (a FIFO, a device, a link loop, a
    huge file); the message names the distribution and the file."""


def safe_distribution(name: str):
    """``importlib.metadata.distribution(name)`` whose files (METADATA, PKG-INFO, RECORD, direct_url.json) are
    read here, once, through the safe reader (``nsa_core._distfiles``: non-blocking, regular files only, at most
    DIST_FILE_MAX), and served from that read after: raises UnreadableDistribution naming the distribution, the
    file and why (a FIFO as flash-attn's METADATA hung env-pairing to its timeout, a link loop made it ERROR:
    round 18 B-1; importlib reads them blocking and whole). Finding the distribution reads folder names only.
    PackageNotFoundError when it is not installed. (Another finder's distribution is returned as it is.)"""
    df = _distfiles()
    dist = df.safe(md.distribution(name))
    if isinstance(dist, df.SafeDistribution):
        for f in _DIST_FILES:
            try:
                dist.read_text(f)
            except df.UnreadableDistFile as e:
                why = (f"is not a regular file ({e.kind}): not read" if e.kind
                       else f"{e.why}: not read" if e.why.startswith("is larger") else e.why)
                raise UnreadableDistribution(f"{name}'s {f} {why}") from None
            except UnicodeDecodeError:  # read (raw); decoding it again raises where it is used, as importlib
                continue
    return dist


def dist_info(names) -> tuple[str | None, str | None, object]:
    """(distribution name, version, distribution) of the first installed of ``names``; UnreadableDistribution
    (``safe_distribution``) for one whose metadata cannot be read: ``detect`` says so."""
    for n in names:
        try:
            d = safe_distribution(n)
        except md.PackageNotFoundError:
            continue
        return d.metadata["Name"], d.version, d
    return None, None, None


def _major(version: str | None) -> int | None:
    m = re.match(r"\s*(\d+)", version or "")
    return int(m[1]) if m else None


def _owns(dist, relpath: str) -> bool:
    try:
        return any(str(f).replace("\\", "/") == relpath for f in (dist.files or []))
    except Exception:  # noqa: BLE001 - an unreadable RECORD is no ownership evidence
        return False


def _spec(name: str):
    """(spec or None, error text or None). find_spec of a submodule imports its parent, which
    can raise anything (a broken flash_attn/__init__)."""
    try:
        return importlib.util.find_spec(name), None
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            return None, None  # the parent package is not there: plainly not installed
        return None, _first_line(e)
    except Exception as e:  # noqa: BLE001
        return None, _first_line(e)


def _is_namespace(spec) -> bool:
    """A package without __init__.py (what flash-attn-4's wheel leaves as ``flash_attn``)."""
    return spec is not None and spec.submodule_search_locations is not None and spec.origin in (None, "namespace")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300] if text else ''}"


def _record(path: str, **kw) -> dict:
    rec = {"path": path, "module": MODULES[path], "what": WHAT[path], "present": False, "not_installed": False,
           "version": None, "dist": None, "reason": "", "error": None, "file": None}
    rec.update(kw)
    return rec


def _accepts_return_lse(fn) -> bool | None:
    try:
        return "return_lse" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None


def detect(path: str, do_import: bool = True) -> dict:
    """The facts for one flash-attn path (see the module doc). Never raises for a known path."""
    if path not in MODULES:
        raise ValueError(f"unknown flash-attn path {path!r}; expected one of {tuple(MODULES)}")
    try:
        return {"fa2": _fa2, "fa3": _fa3, "fa4": _fa4}[path](do_import)
    except Exception as e:  # noqa: BLE001 - a fact, never a crash
        err = f"detection failed: {_first_line(e)}"
        return _record(path, error=err, reason=err)


def summary(rec: dict) -> str:
    """'FA-2 ok (flash-attn 2.8.3)', 'FA-2 absent (the `flash_attn` package here is ...)',
    'FA-3 not installed', 'FA-4 BROKEN: fails to import (...)'."""
    if rec.get("present"):
        return f"{rec['what']} ok ({rec.get('dist') or rec['module']} {rec.get('version') or 'unknown version'})"
    if rec.get("not_installed"):
        why = rec["reason"]
        return f"{rec['what']} " + ("not installed" if why.startswith("not installed") else why)
    return f"{rec['what']} BROKEN: {rec.get('reason') or rec.get('error')}"


def _fa2(do_import: bool) -> dict:
    dname, dver, _ = dist_info(DISTS["fa2"])
    spec, err = _spec("flash_attn")
    rec = _record("fa2", dist=dname, version=dver)
    if dver is not None and _major(dver) != 2:
        return _record("fa2", dist=dname, version=dver, not_installed=True,
                       reason=f"absent (the installed {dname} {dver} is not flash-attn 2.x)")
    if spec is None and err is None:
        if dver is not None:
            rec["error"] = rec["reason"] = f"is not on the path although {dname} {dver} is installed"
            return rec
        rec.update(not_installed=True, reason="not installed (no flash_attn package)")
        return rec
    if _is_namespace(spec) and dver is None:
        n4, v4, _ = dist_info(DISTS["fa4"])
        what = (f"FA-4's namespace: flash_attn.cute only, from {n4} {v4}" if v4 else
                f"an empty namespace package ({', '.join(map(str, spec.submodule_search_locations))})")
        rec.update(not_installed=True, reason=f"absent (the `flash_attn` package here is {what}; "
                                              f"no flash-attn 2.x distribution, no {FA2_EXTENSION})")
        return rec
    if spec is not None:
        rec["file"] = spec.origin
    if not do_import:
        if importlib.util.find_spec(FA2_EXTENSION) is None:
            rec["error"] = rec["reason"] = (f"{dver or '(no distribution metadata)'} has no compiled extension "
                                            f"{FA2_EXTENSION} (an incomplete or source-only install)")
            return rec
        rec.update(present=True, reason="found (not imported)")
        return rec
    mod = _import_into(rec, "flash_attn", err)
    if mod is None:
        return rec
    rec["file"] = getattr(mod, "__file__", None) or rec["file"]
    mver = getattr(mod, "__version__", None)
    rec["version"] = dver or mver
    if dver is None and _major(mver) != 2:
        rec.update(not_installed=True,
                   reason=f"absent (the `flash_attn` package here ({rec['file']}) is no flash-attn 2.x: "
                          f"no distribution metadata, __version__ {mver!r})")
        return rec
    try:
        importlib.import_module(FA2_EXTENSION)
    except Exception as e:  # noqa: BLE001
        rec["error"] = f"{FA2_EXTENSION}: {_first_line(e)}"
        rec["reason"] = f"{rec['version']} imports but its extension {FA2_EXTENSION} does not ({rec['error']})"
        return rec
    missing = [s for s in FA2_SYMBOLS if not callable(getattr(mod, s, None))]
    if missing:
        rec["error"] = rec["reason"] = f"{rec['version']} imports but lacks {', '.join(missing)}"
        return rec
    rec.update(present=True, reason="available")
    return rec


def fa4_jit_cache_dir():
    """Where FA-4's persistent JIT cache goes unless the user chose (per-user cache dir)."""
    from platformdirs import user_cache_path

    return user_cache_path("nsa-run", appauthor=False) / "fa4_jit"


def before_import(module: str) -> None:
    """Settings a package reads once, at its import: this runs before every import of it here.

    flash_attn.cute (FA-4) JIT-compiles every kernel configuration (2-3 s each on an H100;
    fa2-probe's parity needs ~20 forward + ~20 backward ones). Its own persistent cache (keyed by
    its sources, cutlass / tvm-ffi / Python versions) lets a second process or run reuse them; it
    reads FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED / _DIR when its cache_utils is imported, so they
    are set (setdefault: an explicit setting of the user's wins) before the FIRST import of it in
    this process, whichever of detect / adapters / a stage makes it."""
    if module == "flash_attn.cute" or module.startswith("flash_attn.cute."):
        os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
        os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", str(fa4_jit_cache_dir()))


def _import_into(rec: dict, module: str, err: str | None):
    """Import ``module``; on failure record it in ``rec`` (error, reason) and return None. Any
    exception type counts: an ABI mismatch shows up as any of them. ``err``: locating it failed."""
    before_import(module)
    try:
        return importlib.import_module(module)
    except Exception as e:  # noqa: BLE001
        rec["error"] = _first_line(e) if err is None else err
        rec["reason"] = f"fails to import ({rec['error']})"
        return None


def _fa3(do_import: bool) -> dict:
    dname, dver, _ = dist_info(DISTS["fa3"])
    rec = _record("fa3", dist=dname, version=dver)
    spec, err = _spec("flash_attn_interface")
    if spec is None and err is None:
        rec.update(not_installed=True, reason="not installed (no flash_attn_interface module)")
        return rec
    rec["file"] = spec.origin if spec is not None else None
    if not do_import:
        rec.update(present=True, reason="found (not imported)")
        return rec
    mod = _import_into(rec, "flash_attn_interface", err)
    if mod is None:
        return rec
    rec["version"] = dver or getattr(mod, "__version__", None)
    if not callable(getattr(mod, "flash_attn_func", None)):
        rec["error"] = rec["reason"] = "imports but lacks flash_attn_func"
        return rec
    rec.update(present=True, reason="available")
    return rec


def _fa4(do_import: bool) -> dict:
    dname, dver, _ = dist_info(DISTS["fa4"])
    n2, v2, d2 = dist_info(DISTS["fa2"])
    rec = _record("fa4", dist=dname, version=dver)
    if dver is not None and _major(dver) != 4:
        rec.update(not_installed=True, reason=f"absent (the installed {dname} {dver} is not flash-attn-4 4.x)")
        return rec
    bundled = d2 is not None and _owns(d2, _CUTE_INIT)
    if dver is None and bundled:
        # flash-attn 2.8's early CuTe port (0.1.0): not FA-4, whatever it imports
        rec.update(not_installed=True,
                   reason=f"absent (the flash_attn.cute here is {n2} {v2}'s bundled early CuTe port, not FA-4; "
                          "no flash-attn-4 distribution)")
        return rec
    spec, err = _spec("flash_attn.cute")
    if spec is None and err is None:
        if dver is not None:
            rec["error"] = rec["reason"] = f"is not on the path although {dname} {dver} is installed"
            return rec
        rec.update(not_installed=True, reason="not installed (no flash_attn.cute module)")
        return rec
    if spec is None and dver is None:
        # flash_attn.cute cannot even be located: its parent flash_attn fails (a broken FA-2);
        # with no flash-attn-4 distribution that is FA-2's problem, not a broken FA-4
        rec.update(not_installed=True, reason=f"not installed (no flash-attn-4 distribution; "
                                              f"locating flash_attn.cute failed: {err})")
        return rec
    rec["file"] = spec.origin if spec is not None else None
    if not do_import:
        rec.update(present=True, reason="found (not imported)")
        return rec
    mod = _import_into(rec, "flash_attn.cute", err)
    if mod is None:
        return rec
    rec["file"] = getattr(mod, "__file__", None) or rec["file"]
    mver = getattr(mod, "__version__", None)
    fn = getattr(mod, "flash_attn_func", None)
    lse = _accepts_return_lse(fn) if callable(fn) else None
    if not lse:
        why = ("lacks flash_attn_func" if not callable(fn)
               else "its flash_attn_func takes no return_lse (not the 4.x signature)")
        if dver is None:
            rec.update(not_installed=True, reason=f"absent (the flash_attn.cute here is not FA-4: {why}; "
                                                  f"__version__ {mver!r}, no flash-attn-4 distribution)")
        else:
            hint = (f" ({n2} {v2} bundles an older flash_attn/cute and may have overwritten FA-4's files: "
                    f"reinstall {dname})" if v2 else "")
            rec["error"] = rec["reason"] = (f"does not match the installed {dname} {dver}: {why} "
                                            f"(__version__ {mver!r}){hint}")
        return rec
    rec["version"] = dver or mver
    rec.update(present=True, reason="available" if dver else
               f"available (no flash-attn-4 distribution metadata; flash_attn.cute __version__ {mver!r})")
    return rec
