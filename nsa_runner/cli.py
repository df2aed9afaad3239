"""The ``nsa-run`` typer app. This module only wires commands: one module per command under
``nsa_runner/commands/``, each with ``register(app)``. Adding a command is one line in COMMANDS.
"""

from __future__ import annotations

# (the nsa-run script's first signal handlers are installed by the package's __init__, before anything of this
# module's: ``nsa_runner._early``)
import importlib

import typer

from nsa_runner import registry

COMMANDS = (
    "nsa_runner.commands.oneshot",
    "nsa_runner.commands.stage",
    "nsa_runner.commands.list_stages",
    "nsa_runner.commands.compare",
    "nsa_runner.commands.report",
)

app = typer.Typer(
    name="nsa-run",
    help="Validate Native Sparse Attention kernels on this machine and keep the evidence.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

def _version(value: bool) -> None:
    """The version of the nsa_runner that runs (``nsa_runner.__version__``), never a lookup by the
    distribution name: a plugin's ``nsa_run-99.0.dist-info`` earlier on sys.path answered it (round
    13 B-B8), the Name trust round 12 removed from built-in-ness."""
    if value:
        from nsa_runner import __version__ as v

        print(f"nsa-run {v}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the nsa-run version and exit."),
) -> None:
    """Validate Native Sparse Attention kernels on this machine and keep the evidence."""
    _robust_streams()


def _robust_streams() -> None:
    """Text from plugins (reasons, names) may hold lone surrogates or characters the terminal's
    encoding lacks: printed escaped, never a UnicodeEncodeError."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):
            pass


for _module in COMMANDS:
    importlib.import_module(_module).register(app)

USAGE_MESSAGE_CHARS = 300  # a usage error's message at most (an unknown option is echoed in it)


def _clip_usage_errors() -> None:
    """Usage errors found by the command-line parser (an unknown option, an extra argument) echo the
    user's text: ``nsa-run list --x<100 000 characters>`` printed a 107 kB error box. Their message
    is clipped like nsa-run's own error lines (``_text.clip``) before typer prints it."""
    from typer import rich_utils

    from nsa_runner._text import clip, written_out

    show = rich_utils.rich_format_error
    if getattr(show, "_nsa_clipped", False):
        return

    def clipped(e) -> None:  # one line and a hint, as nsa-run's own errors (round 26 U26-4: typer's 5-line box)
        import sys

        try:
            message = e.format_message()
            ctx = getattr(e, "ctx", None)
            command = ctx.command_path if ctx is not None else "nsa-run"
        except Exception:  # noqa: BLE001 - an error of another shape: typer's own box
            show(e)
            return
        if not str(message).strip():  # `nsa-run` alone: the help was printed, nothing to say (round 27 B27-7)
            show(e)
            return
        message = " ".join(str(message).split())  # never over two lines (an option's text may hold a newline),
        message = written_out(message)  # control characters written out, as nsa-run's own error lines
        print(f"error: {clip(message, USAGE_MESSAGE_CHARS)}\nhint: see `{clip(command, 80)} --help`",
              file=sys.stderr, flush=True)

    clipped._nsa_clipped = True
    rich_utils.rich_format_error = clipped


_clip_usage_errors()


def main() -> None:
    """The ``nsa-run`` script. Bad input is reported by each command (one line, exit 2); this is the
    last net: an error nothing anticipated is one line naming it, exit 2, and the traceback only
    with ``--debug`` (anywhere on the command line) or ``NSA_RUN_DEBUG=1``."""
    import os
    import sys

    from nsa_runner._ui import GuardedStdout, OutputError, to_devnull

    _reopen_closed_std_fds()
    from nsa_runner import _bytecode
    from nsa_runner._text import env_switch

    try:  # the on / off switches read here, before any command: a value that is neither is refused
        debug_env = env_switch("NSA_RUN_DEBUG", False)
        env_switch(_bytecode.ENV, True)
        env_switch("NSA_RUN_SPARE_WORKER", True)  # (executor.SPARE_ENV; read by stage / oneshot: round 25 U25-4)
        env_switch("NSA_RUN_ADAPTER_PROCESS", True)  # (stages' _parity.ADAPTER_PROCESS_ENV: a plugin adapter's process)
    except ValueError as e:
        print(f"error: {e}\nhint: unset it, or give 1/true/yes/on or 0/false/no/off", file=sys.stderr, flush=True)
        sys.exit(2)
    from nsa_runner._figures import backend_problem

    problem = backend_problem(os.environ.get("MPLBACKEND"))  # matplotlib's import would refuse it in every stage
    if problem:
        print(f"error: {problem}\nhint: unset MPLBACKEND, or set it to a backend matplotlib knows (e.g. Agg)",
              file=sys.stderr, flush=True)
        sys.exit(2)
    _bytecode.use_cache()  # before torch is imported (by this process or any child)
    from nsa_runner.commands import _common

    _common.PROCESS_ENTRY = True  # a run's recorded exit code is the process's, late signals too
    _common.catch_interrupts()
    debug = "--debug" in sys.argv[1:] or debug_env
    sys.argv[1:] = [a for a in sys.argv[1:] if a != "--debug"]
    sys.stdout = GuardedStdout(sys.stdout)
    try:
        try:
            app()
        finally:  # buffered output fails here, not in the interpreter's exit (a traceback, exit 120)
            sys.stdout.flush()
    except SystemExit:  # typer turns an interrupt into exit 130 without a word
        _common.FINISHING = True  # (first: a signal's handler raised inside _quiet_signals, round 21 B21-5)
        _quiet_signals()  # the process ends now, with this code: a signal in its last steps changes nothing
        if _common.STOPPED_BY and not _common.RUN_STARTED:  # an interrupt some code swallowed: still one
            _say_stopped(_common.STOPPED_BY)                 # (round 13 A-B7: exit 0 after a Ctrl-C)
            sys.exit(_common.EXIT_INTERRUPTED)
        raise
    except KeyboardInterrupt:  # one outside typer's own handling (while it parses the command line)
        _common.FINISHING = True
        _say_stopped(_common.STOPPED_BY or "Ctrl-C")
        sys.exit(_common.EXIT_INTERRUPTED)
    except registry.TempFolderFull as e:  # before a run: the temp folder (TMPDIR) is full (round 13 A-B3)
        _common.FINISHING = True
        try:
            print(f"error: {e.strerror}\nhint: {registry.TEMP_FULL_HINT}", file=sys.stderr, flush=True)
        except OSError:
            pass
        sys.exit(2)
    except OutputError as e:  # > /dev/full, a full disk under a redirect: the output is lost
        _common.FINISHING = True
        to_devnull(sys.stdout)
        try:
            print(f"error: cannot write the output (stdout): {e}", file=sys.stderr, flush=True)
        except OSError:
            pass
        sys.exit(2)
    except Exception as e:  # noqa: BLE001 - a traceback is for --debug only
        _common.FINISHING = True
        if _common.STOPPED_BY and not _common.RUN_STARTED:  # an interrupt that code turned into an error
            _say_stopped(_common.STOPPED_BY)                 # (RuntimeError "Error calling __set_name__")
            sys.exit(_common.EXIT_INTERRUPTED)
        if debug:
            raise
        first = (str(e).strip().splitlines() or [""])[0][:300]
        try:  # stderr may be a closed pipe (``| head``): the exit code still says it
            print(f"error: {type(e).__name__}: {first}" + (" " if first else "")
                  + "(unexpected: rerun with --debug for the traceback)", file=sys.stderr, flush=True)
        except OSError:
            pass
        sys.exit(2)


def _quiet_signals() -> None:
    import signal

    from nsa_runner.manifest import INTERRUPTS

    for sig in INTERRUPTS:
        try:
            signal.signal(sig, signal.SIG_IGN)
        except ValueError:  # not the main thread
            pass


def _say_stopped(how: str) -> None:
    """The one line of a command stopped by a signal outside a run (a run says it itself)."""
    import sys

    _quiet_signals()  # a second signal: still this line and exit 130
    try:
        print(f"interrupted ({how}): nsa-run stopped; nothing is left running", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _reopen_closed_std_fds() -> None:
    """``nsa-run ... <&-`` (or ``>&-``, ``2>&-``): a closed fd 0-2 is reopened on /dev/null before
    anything opens a file, so no pipe or file the runner opens later lands on it (a child started
    with stdin/stdout/stderr=DEVNULL would have it replaced: the watchdog read EOF at once and
    killed every stage). Python set the matching ``sys.std*`` to None; they are given back."""
    import os
    import sys

    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        nul = os.open(os.devnull, os.O_RDWR)
        if nul != fd:
            os.dup2(nul, fd)
            os.close(nul)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False, errors="backslashreplace",
                                    **({"buffering": 1} if mode == "w" else {})))


if __name__ == "__main__":
    main()
