"""The one way nsa-run draws its own figures (the stages' PNGs: selection.png, prefill.png, decode.png; the plots
of report.html): under matplotlib's own default settings, whatever the process's rcParams are.

Round 23 B23-4: matplotlib's rcParams are process-global, and an implementation's adapter (or a stage plugin, or a
user's matplotlibrc) may set them: ``matplotlib.rcParams["text.usetex"] = True``, common in research code, at the
adapter module's import made selection-map's own figure fail ("latex could not be found"), every implementation's
verdict lost. ``impls.adapter_code`` puts back what an adapter's code changed, but where that code was matplotlib's
first import there is nothing from before to put back; so the figures themselves are drawn in a context of
matplotlib's defaults (``matplotlib.style.use("default")`` inside ``matplotlib.rc_context``: every setting comes back
after, the backend is left as chosen), TeX off.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def drawing(rc: dict | None = None) -> Iterator[None]:
    """Draw (and save) a figure inside: matplotlib's default settings, ``text.usetex`` off, then ``rc`` (a
    caller's own few settings, e.g. report.py's ``text.parse_math`` off for labels taken from data)."""
    import matplotlib
    import matplotlib.style

    with matplotlib.rc_context():
        with warnings.catch_warnings():  # a deprecation note of matplotlib's about its defaults is nobody's concern
            warnings.simplefilter("ignore")
            matplotlib.style.use("default")
        matplotlib.rcParams.update({"text.usetex": False, **(rc or {})})
        yield


def backend_problem(value: str | None) -> str | None:
    """Why matplotlib would refuse ``value`` as MPLBACKEND, or None. matplotlib reads that variable at its import and
    refuses a name it does not know there, so with one set, every stage that draws and report.html failed, after
    the whole run (round 24 U24-4); nsa-run asks before any command. A name matplotlib knows is accepted (nsa-run
    draws on its own Agg canvases whatever the backend). Asked of matplotlib itself, imported with the variable
    unset; no matplotlib, or an empty value (matplotlib ignores it): nothing to say."""
    import os

    if not value:
        return None
    saved = os.environ.pop("MPLBACKEND", None)
    try:
        from matplotlib import rcsetup
    except Exception:  # noqa: BLE001 - no (usable) matplotlib: the stages say so themselves
        return None
    finally:
        if saved is not None:
            os.environ["MPLBACKEND"] = saved
    try:
        rcsetup.validate_backend(value)
    except (ValueError, TypeError):
        from nsa_runner._text import clip

        return f"MPLBACKEND={clip(repr(value), 80)} is not a backend matplotlib knows: its import refuses it"
    return None
