"""The nsa-run script's first signal handlers, installed by the package's ``__init__`` before anything else loads.

Imports nothing but ``os``, ``signal`` and ``sys``: it runs before ``nsa_runner.stage`` (enum, dataclasses) and the
CLI's typer / rich imports, which take 20 ms on an idle machine and 120-270 ms on a loaded one; installed only at
``cli.py``'s first line, a Ctrl-C in that time printed a KeyboardInterrupt traceback and a TERM / HUP exited 143 / 129
(red-team round 47 B47a-1).
"""

from __future__ import annotations


def early_interrupts() -> None:
    """(The nsa-run script only.) From the package's first line until ``main`` installs the real handlers, a Ctrl-C,
    SIGTERM, SIGHUP or SIGQUIT (Ctrl-backslash) ends the process at once with the one interrupted line and exit 130:
    nothing has started yet (importing typer, rich, the commands takes a second or more on a loaded machine; a
    Ctrl-C there printed a KeyboardInterrupt traceback, a TERM exited 143). An ignored signal (``nohup``, a
    background job's SIGINT) stays ignored. Not when the package is imported by other code (tests, an embedding):
    their handlers are theirs."""
    import _signal  # (built in: ``signal``'s import builds its enums first, a window of its own, round 48 B48a-3)
    import os
    import sys

    main_file = getattr(sys.modules.get("__main__"), "__file__", None) or ""
    if not os.path.basename(main_file).startswith("nsa-run"):
        return
    names = {_signal.SIGINT: "Ctrl-C", _signal.SIGTERM: "SIGTERM", _signal.SIGHUP: "SIGHUP", _signal.SIGQUIT: "SIGQUIT"}

    def stop(signum, frame):
        how = names.get(signum, f"signal {signum}")
        try:
            os.write(2, f"interrupted ({how}): nsa-run stopped; nothing is left running\n".encode())
        except OSError:
            pass
        os._exit(130)

    for sig in names:  # (manifest.INTERRUPTS, not loaded)
        try:
            if _signal.getsignal(sig) != _signal.SIG_IGN:
                _signal.signal(sig, stop)
        except (ValueError, OSError):  # not the main thread
            pass
