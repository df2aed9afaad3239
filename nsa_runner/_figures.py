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
