"""triton for nsa_core's kernels, read once: ``triton`` and ``tl`` (``triton.language``) when both import and hold the
API the kernels use, else both None and ``PROBLEM`` says why: not installed; broken, any exception at its import
(round 43 B43-3: a RuntimeError / OSError of a driver or library mismatch; round 44 B44-2: a ``sys.exit`` in it); or
a stub or partial install without ``triton.jit`` (round 44 B44-3: the ``@triton.jit`` lines then failed nsa_core's
import in every CPU path). Every nsa_core module takes triton from here, so each CPU path runs as it does without
triton. A KeyboardInterrupt is never swallowed: it is how Ctrl-C arrives."""

from __future__ import annotations

import importlib.util

# what nsa_core's kernels use at their definition or launch
_API = {"triton": ("jit", "cdiv", "next_power_of_2"),
        "triton.language": ("constexpr", "program_id", "arange", "load", "store", "dot", "zeros", "where", "sum",
                            "max", "exp", "static_range")}


def _one_line(e: BaseException) -> str:
    try:
        text = str(e)
    except Exception:  # noqa: BLE001 - an exception whose text cannot be read
        text = "<unprintable>"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{type(e).__name__}: {first[:200]}" if first else type(e).__name__


def _jit_probe(x):  # a function triton.jit must turn into a launchable kernel (never launched)
    pass


def _load():
    """(triton, triton.language, None, None) or (None, None, why, the exception or None)."""
    try:
        if importlib.util.find_spec("triton") is None:  # (round 46 B46-2: a partial triton's ImportError names
            return None, None, "triton is not installed", None  # "triton" too; only no module at all is this)
        import triton
        import triton.language as tl

        # read, not hasattr: a lazy module's ``__getattr__`` may raise anything (round 45 B45-1)
        missing = [f"{name}.{attr}" for name, module in (("triton", triton), ("triton.language", tl))
                   for attr in _API[name] if getattr(module, attr, None) is None]
        # round 46 B46-1: a triton.jit that raises when applied, or makes no kernel, failed nsa_core's import at its
        # ``@triton.jit`` lines (the CPU paths FAILed) or every launch
        kernel = None if missing else triton.jit(_jit_probe)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - a broken install, whatever it raises
        return None, None, f"triton fails to import ({_one_line(e)})", e
    if missing:
        return None, None, (f"triton lacks {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} "
                            "(a stub or a partial install)"), None
    if not callable(getattr(type(kernel), "__getitem__", None)):
        return None, None, f"triton.jit makes no kernel (it returned {type(kernel).__name__})", None
    return triton, tl, None, None


triton, tl, PROBLEM, ERROR = _load()
if ERROR is not None:
    ERROR = ERROR.with_traceback(None)  # its frames are not kept alive
