"""What ``oneshot`` and ``stage`` share: option validation, run folders, running, reporting."""

from __future__ import annotations

import errno
import math
import os
import shutil
import signal
import sys
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from nsa_runner._text import PARITY_JOBS_ENV, parity_jobs
from nsa_runner._torch_check import torch_facts
from nsa_runner._ui import ProgressObserver, err_console, fail, path_text, plain_text, report, shown
from nsa_runner._worker import PROFILE_ENV
from nsa_runner.artifacts import (
    ManifestError,
    _folder_number,
    check_writable,
    clean_stale,
    load_manifest,
    run_folders,
    run_id,
)
from nsa_runner.executor import (
    LOG_LIMIT_ENV,
    LOG_LIMIT_MIB,
    SPARE_ENV,
    RunInterrupted,
    Settings,
    Terminated,
    execute,
    exit_code,
    log_limit,
    note_signal,
    received_count,
    spare_on,
)
from nsa_runner.manifest import (
    INTERRUPTS,
    LOCK_TIMEOUT_ENV,
    LOCK_TIMEOUT_S,
    ManifestBusy,
    RunManifest,
    SetAsideIncomplete,
    lock_timeout,
)
from nsa_runner.registry import (
    DISCOVERY_TIMEOUT_ENV,
    DISCOVERY_TIMEOUT_S,
    Machine,
    OptionError,
    StageEntry,
    discovery_timeout,
    installed_metadata_problem,
    parse_options,
    triton_installed,
)
from nsa_runner.results import counts
from nsa_runner.results.junit import case_table_problems
from nsa_runner.results.reports import reports_digest, write_run_reports

DEFAULT_OUT = Path("artifacts/runner")
DEVICES = ("cuda", "cpu")
PROFILES = ("quick", "full")
EXIT_INTERRUPTED = 130

def path_option(what: str) -> Callable[[str | Path], Path]:
    """The parser of a path option (``--out``, ``--save-baseline``): an empty path (``--out ""``,
    which would silently mean the current folder) is refused, naming ``what`` to give instead."""
    def parse(text: str | Path) -> Path:
        if not str(text).strip():
            raise typer.BadParameter(f"empty path: give {what}")
        return Path(text)

    return parse


# typer option declarations shared by both commands
OUT = typer.Option(DEFAULT_OUT, "--out", parser=path_option("the output folder, e.g. --out artifacts/runner"),
                   help="Output root; the run folder is <out>/<run-id>/.")
DEVICE = typer.Option(None, "--device", help="cuda or cpu (default: cuda when available).")
PROFILE = typer.Option(None, "--profile",
                       help="quick (tiny shapes) or full (default: full on CUDA, quick otherwise).")
TIMEOUT = typer.Option(None, "--timeout", help="Per-stage timeout in seconds (overrides each stage's own).")
STRICT = typer.Option(False, "--strict", help="Also fail on skips this machine should be able to run.")
JSON = typer.Option(False, "--json", help="Machine-readable result on stdout (JSON only).")


def resolve_machine(device: str | None, profile: str | None, timeout: float | None) -> tuple[Machine, str]:
    """Validate --device / --profile / --timeout; returns (machine, profile)."""
    if device is not None and device not in DEVICES:
        fail(f"--device {shown(device)} is not one of {', '.join(DEVICES)}")
    if profile is not None and profile not in PROFILES:
        fail(f"--profile {shown(profile)} is not one of {', '.join(PROFILES)}")
    if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):
        fail(f"--timeout must be a positive number of seconds (finite), got {timeout:g}")
    try:  # a bad discovery limit is named, never a silent fall-back to the default
        discovery_timeout()
    except ValueError as e:
        fail(str(e), f"unset it (default {DISCOVERY_TIMEOUT_S:g}s) or give seconds, e.g. {DISCOVERY_TIMEOUT_ENV}=300")
    try:  # torch (and MKL) cannot load from a deleted cwd: it ended rc 2 without a word
        os.getcwd()
    except OSError as e:
        fail(f"the current folder cannot be read ({e.strerror or e}; deleted?)", "cd to an existing folder and rerun")
    problem = installed_metadata_problem()
    if problem:  # importing torch or any plugin would read it: `nsa-run list` hung forever on a FIFO
        fail(f"an installed package's metadata cannot be read: {problem}",
             "remove or reinstall that package (its folder is named in the path)")
    # torch is imported in a child process (``_torch_check``): what installed code does at torch's import (a
    # device backend's init that exits, changes the folder or hangs: round 21 B21-1 / B21-2) stays there, a
    # hang is stopped, Ctrl-C stops the wait at once (in this process the import ran with signals deferred)
    torch = torch_facts()
    if torch.problem:
        fail(torch.problem, torch.hint)
    cuda, triton = torch.cuda, triton_installed()
    if device == "cuda" and not cuda:
        fail("--device cuda: no CUDA device here (torch.cuda.is_available() is False)",
             "run without --device, or use --device cpu")
    device = device or ("cuda" if cuda else "cpu")
    machine = Machine(cuda=cuda, triton=triton, device=device)
    return machine, profile or ("full" if device == "cuda" else "quick")


MIN_FREE_BYTES = 64 << 20  # a quick run writes a few MB; below this a run would die mid-way


def _not_a_folder(out: Path) -> str:
    """"/dev/full is a character device, not a folder" where ``out`` or a folder above it is no folder, else ""
    (round 25 U25-6: ``--out /dev/full`` was refused "File exists")."""
    import stat

    from nsa_runner.artifacts import entry_kind

    for p in (out, *out.parents):
        try:
            mode = os.stat(p).st_mode
        except OSError:
            continue
        return "" if stat.S_ISDIR(mode) else f"{p} is {entry_kind(mode)}, not a folder"
    return ""


def check_out(out: Path) -> Path:
    """Resolve ``--out`` once, against the caller's cwd, and check it is writable and has room.

    Returns the absolute path: everything after this (the run folder, the manifest, every
    stage's ``ctx.dir``, whose process runs with the run folder as its cwd) uses it, so a
    relative ``--out`` never lands nested inside the run folder (DESIGN §7). What an earlier
    nsa-run killed mid-way left (``.incoming-`` folders, stage temp folders) is removed here.
    """
    given = Path(out).expanduser()
    for link in (given, *given.parents):  # a link to what is not there: an unmounted disk, a moved folder
        try:
            dangling = link.is_symlink() and not os.path.lexists(os.path.realpath(link))
        except (OSError, RuntimeError):
            dangling = False
        if dangling:  # its target's folders were made and the run written there (round 17 A U-a)
            fail(f"--out {out}: {link} is a symbolic link to {os.readlink(link)}, which does not exist",
                 "create (or mount) what the link points to, or choose another folder with --out")
    try:
        out = given.resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop (RuntimeError before Python 3.13)
        fail(f"--out {out}: cannot be resolved ({getattr(e, 'strerror', None) or e})",
             "choose a folder that is not a symlink loop with --out")
    made = [p for p in (out, *out.parents) if not os.path.lexists(p)]  # what the check makes, deepest first
    try:
        return _checked_out(out)
    except typer.Exit:  # refused: the folders made for the check are not left behind (round 37 U37-3)
        for folder in made:
            try:
                folder.rmdir()
            except OSError:
                break
        raise


def _checked_out(out: Path) -> Path:
    """``check_out``'s checks of the resolved ``out`` (which they create where it is missing)."""
    try:
        check_writable(out)
        free = shutil.disk_usage(out).free
    except OSError as e:
        fail(f"--out {out}: cannot write there ({_not_a_folder(out) or e.strerror or e})",
             "choose a writable folder with --out")
    try:
        lock_timeout()
    except ValueError as e:
        fail(str(e), f"unset it (default {LOCK_TIMEOUT_S:g}s) or give seconds, e.g. {LOCK_TIMEOUT_ENV}=300")
    try:
        spare_on()
    except ValueError as e:
        fail(str(e), f"unset it (on) or set {SPARE_ENV}=0 to turn the spare worker off")
    try:
        log_limit()
    except ValueError as e:
        fail(str(e), f"unset it (default {LOG_LIMIT_MIB:g} MiB) or give MiB, e.g. {LOG_LIMIT_ENV}=1024")
    try:
        parity_jobs()
    except ValueError as e:
        fail(str(e), f"unset it (one per two CPU cores, at most 8) or give a count, e.g. {PARITY_JOBS_ENV}=4")
    profiles = os.environ.get(PROFILE_ENV, "")
    named = profiles.strip(" \t\n\r\v\f")  # (round 34 B34-6: " /x", a lone newline or CR made odd folders)
    if profiles and not named:  # blank: unset (round 33 B33-7: "  " was made a folder)
        os.environ.pop(PROFILE_ENV, None)
    elif profiles:  # a developer's aid: an unwritable folder lost every profile, said only in the stages' logs
        odd = next((c for c in named if not c.isprintable()), None) or (  # a control character in it, or a
            named[0] if named[0].isspace() else named[-1] if named[-1].isspace() else None)  # Unicode space at an end
        if odd is not None:
            fail(f"{PROFILE_ENV}={shown(profiles, 80)}: holds {odd!r}, which no folder name is meant to",
                 f"unset {PROFILE_ENV} or name a folder plainly")
        try:  # (round 32 U32-4), and a relative one was written inside the run folder, the worker's working folder,
            # while the one the user named stayed empty (round 33 B33-7): made absolute here, for the workers
            folder = os.path.abspath(os.path.expanduser(named))
            if Path(folder).resolve() == out or out in Path(folder).resolve().parents:  # (round 35 B35-4: a stage's
                fail(f"{PROFILE_ENV}={shown(profiles, 80)} is inside --out {out}: the profiles would be written "
                     "among the runs' files (over a stage's own <stage>.txt)",  # own <stage>.txt overwritten)
                     f"unset {PROFILE_ENV} or name a folder outside --out")
            check_writable(Path(folder))
        except (OSError, ValueError) as e:
            fail(f"{PROFILE_ENV}={shown(profiles, 80)}: cannot write profiles there "
                 f"({getattr(e, 'strerror', None) or e})", f"unset {PROFILE_ENV} or name a writable folder")
        os.environ[PROFILE_ENV] = folder
    if free < MIN_FREE_BYTES:
        fail(f"--out {out}: only {free / 2**20:.1f} MiB free on its disk (a run needs at least "
             f"{MIN_FREE_BYTES / 2**20:.0f} MiB)", "free some space or choose another folder with --out")
    clean_stale(out)
    return out


def check_earlier_runs(out: Path, rid: str) -> list[Path]:
    """Earlier run folders of this run id; exit 2 (touching nothing) if one is unusable.

    A folder with nothing in it (what an nsa-run before issue 16 left on a full disk) holds no
    result: it is passed over, never an obstacle."""
    folders = []
    for folder in run_folders(out, rid):
        if folder.is_symlink():  # written through, it changed the run it leads to (a rerun moved its files)
            try:
                target = os.readlink(folder)
            except OSError:
                target = "?"
            fail(f"run folder {folder} is a symlink (to {target}), not a run folder of its own: nsa-run "
                 "never writes into a run through a link",
                 "nothing was changed; move the link aside (or give --out the folder it leads to) and rerun")
        try:
            if not any(folder.iterdir()):
                continue
        except OSError:
            pass
        try:
            data = load_manifest(folder)
        except ManifestError as e:
            fail(f"earlier run folder is unusable: {e}",
                 f"nothing was changed; repair or move {folder} aside, then rerun")
        RunManifest.recover_folder(folder, data)  # a rerun whose runner died: its earlier result back
        folders.append(folder)
    return folders


def new_manifest(make: Callable[[], RunManifest | None]) -> RunManifest | None:
    """``make()`` (a new run folder with its manifest); a full disk or an unwritable folder exits 2."""
    try:
        return make()
    except OSError as e:
        fail(f"cannot create the run folder: {e.strerror or e}", _disk_hint(e))


def open_latest_run(out: Path, rid: str, argv: list[str], **facts: Any) -> RunManifest:
    """The latest run folder of ``rid`` (``nsa-run stage X`` goes there), or a new one. Two
    ``stage`` commands into an empty ``--out`` at once end up in the same folder.

    A name of the run id taken by something that is no run folder (a user's file, a dangling link)
    is passed over as ``oneshot`` does (``<rid>.2``), and named on one line; it spun here forever."""
    for _ in range(1000):  # each turn another nsa-run made the folder meanwhile: a few at most
        folders = check_earlier_runs(out, rid)
        if folders:
            try:
                return RunManifest.open(folders[-1], argv)
            except ManifestBusy as e:  # a lock held by another process: named, nothing changed
                fail(str(e), "nothing was changed")
            except ManifestError as e:
                fail(f"earlier run folder is unusable: {e}",
                     f"nothing was changed; repair or move {folders[-1]} aside, then rerun")
            except OSError as e:
                fail(f"cannot update {folders[-1]}: {e.strerror or e}", _disk_hint(e))
        made = new_manifest(lambda: RunManifest.new(out, rid, argv, only_first=True, **facts))
        if made is not None:
            _say_passed_over(out, rid, made.dir)
            return made  # else another nsa-run created it a moment ago: open that one
    fail(f"no run folder of {rid} under {out} could be opened or made (other nsa-run commands kept "
         "taking the name)", "nothing was changed; rerun")


def _say_passed_over(out: Path, rid: str, made: Path) -> None:
    """One line naming the names of run id ``rid`` below ``made`` that are no run folder."""
    n = _folder_number(made)
    for i in range(1, n):
        p = out / (rid if i == 1 else f"{rid}.{i}")
        if os.path.lexists(p) and not p.is_dir():
            try:
                what = f"a link to no folder ({path_text(os.readlink(p))})" if p.is_symlink() else "a file"
            except OSError:
                what = "not a folder"
            err_console().print(f"note: {path_text(p)} is {what}, not a run folder: passed over (left as it is); "
                                f"this run's folder is {path_text(made.name)}", soft_wrap=True)


def set_aside(manifest: RunManifest, name: str) -> Path | None:
    try:
        return manifest.set_aside(name)
    except ManifestBusy as e:
        fail(str(e), "nothing was changed")
    except ManifestError as e:
        fail(f"run folder is unusable: {e}", "nothing was changed")
    except SetAsideIncomplete as e:  # the one case where the earlier result is not where it was
        fail(f"cannot set the earlier {name} result aside: {e.strerror or e}",
             "move those files back by hand (nothing records where they are), then rerun")
    except OSError as e:  # everything moved went back (RunManifest.set_aside is all or nothing)
        fail(f"cannot set the earlier {name} result aside: {e.strerror or e}", _disk_hint(e))


def _disk_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def _disk_hint(e: OSError) -> str:
    if _disk_full(e):
        return "the disk is full: free some space, then rerun (earlier runs are untouched)"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "the --out folder (or something in it) is not writable: fix its permissions or choose another --out"
    return "fix what is named above (see its path), then rerun (earlier runs are untouched)"


def parse_stage_options(entry: StageEntry, args: list[str]) -> dict[str, Any]:
    """Parse ``--flag value`` / ``--flag=value`` against the stage's options; defaults filled in.

    The stage's own ``Option.parse`` runs in a child process (plugin code never runs in the CLI)."""
    try:
        return parse_options(entry, list(args))
    except OptionError as e:
        fail(str(e), e.hint)


def default_options(entry: StageEntry) -> dict[str, Any]:
    return {o.dest: o.default for o in entry.options}


def run_and_report(plan: list[tuple[StageEntry, dict[str, Any]]], manifest: RunManifest,
                   machine: Machine, profile: str, timeout: float | None, strict: bool,
                   as_json: bool, after: Callable[[int], int] | None = None, stopped: bool = False) -> None:
    """Execute the plan with live progress, report, and exit with the DESIGN §5 code.

    ``after(code) -> code`` runs once the stages are done and before anything is reported
    (oneshot: report.html and the baseline check), so the JSON, the table and the exit code
    all carry the final verdict and the counts line is printed once, last.

    ``stopped``: the user's Ctrl-C / TERM / HUP came after this command set a rerun's earlier result aside
    and before the run began (``interrupt_puts_back``): no stage runs, the run is recorded as
    interrupted the way an interrupt of its stages is (the earlier result put back, exit 130).
    """
    previous = {sig: signal.getsignal(sig) for sig in INTERRUPTS[1:]}
    closing = _Closing()
    if stopped:  # stopping already: a second signal is noted, never raised (the put-back is not cut off)
        closing.start()
    settings = Settings(device=machine.device, profile=profile, timeout_s=timeout, strict=strict)
    err = err_console()
    err.print(f"[bold]nsa-run[/] run {plain_text(manifest.data['run_id'])} -> {path_text(manifest.dir)}  "
              f"(device={machine.device}, profile={profile})")

    def _term(signum, frame):  # a CI cancel stops the stage like Ctrl-C does (the reason names it)
        note_signal(signum)
        raise Terminated(signum)

    # TERM and HUP (a closed terminal / ssh session) stay handled until this command exits: one
    # arriving while the closing reports are written is an interrupt like Ctrl-C, never the default
    # action (the process exited 129 while manifest.json recorded 130)
    if not stopped:
        for sig in INTERRUPTS[1:]:  # (Ctrl-C: KeyboardInterrupt, Python's own)
            catch(sig, _term)
    global RUN_STARTED
    if STOPPED_BY is not None and not stopped:  # an interrupt that came before the run and was swallowed on the
        raise KeyboardInterrupt  # way (plugin or C extension code taking it): no stage runs after a Ctrl-C
    RUN_STARTED = True  # from here on the run reports an interrupt itself (manifest, closing lines)
    try:
        _run_and_report(plan, manifest, machine, profile, strict, as_json, after, settings, err, closing, stopped)
    except typer.Exit as done:
        if PROCESS_ENTRY:  # the nsa-run script: the process ends now, with the recorded code
            _end_with(done.exit_code)
        raise
    finally:
        if not PROCESS_ENTRY:  # embedded (tests, a caller's process): its handlers come back
            for sig, handler in previous.items():
                signal.signal(sig, handler)


# set by ``cli.main`` (the nsa-run script): once a run's exit code is recorded, a late Ctrl-C,
# TERM or HUP ends the process with that code instead of the signal's default action
PROCESS_ENTRY = False
RUN_STARTED = False  # run_and_report began: an interrupt is recorded and reported by the run itself
STOPPED_BY: str | None = None  # the signal that stopped a command outside a run ("SIGTERM", "Ctrl-C")
FINISHING = False  # set by cli.main as the process ends: a signal then changes nothing (round 21 B21-5)
_PUT_BACK = ""  # "armed" from a rerun's set-aside until its run began; "raised" once its interrupt was raised


def catch(sig: int, handler) -> None:
    """``signal.signal(sig, handler)`` unless ``sig`` is ignored: ``nohup nsa-run oneshot`` (SIGHUP
    ignored) or a background job's SIGINT keep ignoring it (a closed ssh session stopped a nohup run)."""
    try:
        if signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, handler)
    except ValueError:  # not the main thread (embedded use)
        pass


def catch_interrupts() -> None:
    """(The nsa-run script.) Ctrl-C, SIGTERM, SIGHUP and SIGQUIT (``manifest.INTERRUPTS``) stop any command as an
    interrupt, exit 130, with one line saying so (``list``, ``compare``, ``report``, a ``stage`` waiting for the run
    folder's lock ended silently: TERM 143, HUP 129, Ctrl-C 130). A run installs its own handlers and records the
    interrupt in its manifest."""
    def stop(signum, frame):
        global STOPPED_BY, _PUT_BACK
        if FINISHING:  # cli.main ends the process now, with its code: nothing to stop (round 21 B21-5)
            return
        STOPPED_BY = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        note_signal(signum)
        if _PUT_BACK == "raised" and not RUN_STARTED:  # the first one's put-back runs: noted, never cut off
            return                                      # (round 21 B21-4: the next of three signals raised in it)
        if _PUT_BACK == "armed":
            _PUT_BACK = "raised"
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(signum)

    for sig in INTERRUPTS:
        catch(sig, stop)


def _end_with(code: int) -> None:
    """Until the interpreter's exit a late signal exits with ``code`` at once; from the exit's last
    steps on (the interpreter puts the default actions back when it finalises: a HUP there killed
    the process, exit 129) it is ignored: the process ends anyway, with ``code``."""
    import atexit

    def handler(signum, frame):
        os._exit(code)

    def ignore() -> None:
        for sig in INTERRUPTS:
            signal.signal(sig, signal.SIG_IGN)

    for sig in INTERRUPTS:
        catch(sig, handler)
    atexit.register(ignore)


class _Closing:
    """A run's closing records (summaries, junit.xml, exit code): from ``start`` on, a Ctrl-C, SIGTERM
    or SIGHUP is noted (``late``), never raised in the middle of them; the run is then recorded as
    interrupted. While ``armed`` (``after``: report.html, the baseline check) the first one is
    raised as the interrupt it is, and is noted too. One set of handlers from the stages' end until
    the exit code is recorded: a signal between two guarded steps was raised bare (exit 130
    without the records), and one while the summaries were written was dropped (round 13 B-B7:
    ``finish_run`` set SIG_IGN over the handler that notes it: exit 0, ``interrupted: false``)."""

    def __init__(self):
        self.late: list[int] = []
        self.armed = False
        self.started = False

    def _note(self, signum, frame) -> None:
        self.late.append(signum)
        note_signal(signum)
        if self.armed:
            self.armed = False
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise Terminated(signum)

    def start(self) -> None:
        if self.started:
            return
        self.started = True
        for sig in INTERRUPTS:
            catch(sig, self._note)


def _run_and_report(plan, manifest: RunManifest, machine: Machine, profile: str, strict: bool,
                    as_json: bool, after, settings: Settings, err, closing: _Closing, stopped: bool) -> None:
    interrupted = False
    records: list = []  # filled by execute as each stage is recorded
    signals_before = received_count()  # an error after one of the user's signals is part of that interrupt
    try:
        if stopped:  # interrupted before the run began (``run_and_report``): no stage runs
            raise KeyboardInterrupt
        with ProgressObserver(err, total=len(plan)) as obs:
            execute(plan, manifest, settings, machine, obs, records=records)
        closing.start()  # inside the try: a signal before this line is the run's interrupt (below)
    except KeyboardInterrupt as intr:  # RunInterrupted, or one landing as execute returned
        closing.start()
        interrupted = True
        if not isinstance(intr, RunInterrupted):  # the manifest's finish may not have happened, nor the put-back
            # of what this process set aside (round 20 A A20-R1: one landing outside execute's own handling, or
            # before the run began, left a rerun's earlier result in history/ and its note in pending)
            _put_back_interrupted(manifest, err)
        elif intr.waiting:  # what execute could not put back (it did what _put_back_interrupted does)
            _say_waiting(intr.waiting, "", err)
    except (OSError, ManifestError) as e:  # e.g. the disk filled up: the run cannot be recorded
        if received_count() == signals_before:
            run_broke(manifest, e)
        # raised while the run stopped on the user's Ctrl-C / TERM / HUP (round 19 A19-R1: an errno of the
        # interrupt's own unwinding was recorded as the run's reason, "incomplete", on a finished run): the
        # interrupt it is; a rerun's earlier result is put back, the run recorded interrupted, never incomplete
        closing.start()
        interrupted = True
        _interrupted_broke(manifest, e, err)
    code = EXIT_INTERRUPTED if interrupted else exit_code(records, strict)
    # the closing records (summaries, junit.xml, the exit code) are always written: a signal from
    # here on is noted, never raised in the middle of them (a SIGTERM after a rerun's record
    # exited 130 without a word, leaving the earlier run's summary.md / junit.xml saying PASS for
    # a stage now recorded FAIL, and its exit_code); the run is then recorded as interrupted
    finish_run(manifest, err)
    if closing.late and not interrupted:
        interrupted, code = True, EXIT_INTERRUPTED
        _finish_interrupted(manifest)
        finish_run(manifest, err)
    if after is not None and not interrupted:
        closing.armed = True  # report.html / the baseline check: a Ctrl-C stops them
        try:
            code = after(code)
        except KeyboardInterrupt:
            pass
        finally:
            closing.armed = False
        if closing.late:  # raised there (or taken by it): recorded as interrupted, never a traceback
            interrupted, code = True, EXIT_INTERRUPTED
            _finish_interrupted(manifest)
            finish_run(manifest, err)
    try:  # make reports 2 for any failure: the CLI's own code stays here
        manifest.set_fields(exit_code=code, **({"interrupted": True} if interrupted else {}))
        if closing.late and not interrupted:  # during that write: the summaries say interrupted too
            interrupted, code = True, EXIT_INTERRUPTED
            manifest.set_fields(exit_code=code, interrupted=True)
            finish_run(manifest, err)
    except (OSError, ManifestError) as e:
        if not interrupted:
            run_broke(manifest, e)
        err.print(f"[yellow]note:[/] the exit code of the interrupted run was not recorded: {_what(e)}",
                  soft_wrap=True)
    # the exit code is recorded: a late Ctrl-C / TERM / HUP ends the command with that same code
    _late = _exit_with(code)
    for sig in INTERRUPTS:
        catch(sig, _late)
    try:
        _print_run(records, manifest, machine, profile, strict, as_json, interrupted, code, err)
    finally:
        catch(signal.SIGINT, signal.default_int_handler)
    raise typer.Exit(code)


@contextmanager
def signals_noted():
    """Ctrl-C, SIGTERM and SIGHUP are noted (in the list yielded), never raised, while the block
    runs: the run's closing records are written whole. The handlers come back after it."""
    late: list[int] = []

    def note(signum, frame):
        late.append(signum)

    sigs = INTERRUPTS
    previous = {}
    try:
        for sig in sigs:
            if signal.getsignal(sig) != signal.SIG_IGN:
                previous[sig] = signal.signal(sig, note)
    except ValueError:  # not the main thread (embedded use): nothing to guard
        pass
    try:
        yield late
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _what(e: Exception) -> str:
    return plain_text(f"{e.strerror or e}" if isinstance(e, OSError) else str(e))


def _interrupted_broke(manifest: RunManifest, e: Exception, err) -> None:
    """An error that escaped the stages while the run stopped on an interrupt: the rerun's earlier result put
    back (``abandon``), the run recorded interrupted (never ``incomplete``: the run was stopped, not broken);
    what could not be put back is named, as ``run_broke`` names it."""
    _put_back_interrupted(manifest, err, f"; {_what(e)}")


def _put_back_interrupted(manifest: RunManifest, err, why: str = "") -> None:
    """A run stopped by the user's interrupt: what this process set aside put back (``abandon``), the run
    recorded interrupted; what could not be put back is named. Best effort: a write that fails is named by
    the closing reports' own write."""
    try:
        waiting = manifest.abandon()
    except (OSError, ManifestError):
        waiting = []
    _finish_interrupted(manifest)
    _say_waiting(waiting, why, err)


def _say_waiting(waiting: list[str], why: str, err) -> None:
    if waiting:
        where = plain_text(", ".join(waiting))
        err.print(f"[yellow]warning:[/] the earlier result could not be put back yet ({where}, recorded in "
                  f"manifest.json's pending{why}): the next nsa-run stage / oneshot into this --out puts it "
                  "back", soft_wrap=True)


@contextmanager
def interrupt_puts_back(run: Callable[..., None]):
    """From a rerun's ``set_aside`` to the moment its run begins (``run_and_report``: ``RUN_STARTED``), the user's
    Ctrl-C / TERM / HUP (``KeyboardInterrupt``) is the run's interrupt: ``run(stopped=True)``, the run's own
    handling of one (what this process set aside put back, the run recorded interrupted, summaries, exit 130).
    Round 20 A A20-R1: the generic handler took it, exit 130 with the earlier result left in history/ and its
    ``pending`` note kept, the folder then read "runner died". Once the run began, the run handles it. After the
    first signal, the ones that follow before the run began are noted, never raised (``catch_interrupts``' handler:
    round 21 B21-4, two or three together, the second raised inside the put-back and cut it off)."""
    global _PUT_BACK
    _PUT_BACK = "armed"
    try:
        yield
    except KeyboardInterrupt:
        if RUN_STARTED:
            raise
        _PUT_BACK = "raised"  # (an interrupt not raised by the handler: a signal's default one)
        run(stopped=True)
    finally:
        _PUT_BACK = ""


def _finish_interrupted(manifest: RunManifest) -> None:
    """The manifest says interrupted (and finished), best effort: a full disk is named by the
    closing reports' own write."""
    try:
        manifest.finish(interrupted=True)
    except (OSError, ManifestError):
        pass


def _exit_with(code: int):
    def handler(signum, frame):
        raise typer.Exit(code)
    return handler


def _print_run(records, manifest: RunManifest, machine: Machine, profile: str, strict: bool,
               as_json: bool, interrupted: bool, code: int, err) -> None:
    payload = {
        "schema_version": 1,
        "run_id": manifest.data["run_id"],
        "run_dir": str(manifest.dir),
        "manifest": str(manifest.path),
        "device": machine.device,
        "profile": profile,
        "interrupted": interrupted,
        "exit_code": code,
        "counts": counts(records),
        "stages": [r.to_dict() for r in records],
    }
    if interrupted:  # (what was stopped: a stage, or nothing yet: a signal before any stage began)
        stopped = ("the running stage was stopped" if any(getattr(r, "interrupted", False) for r in records)
                   else "no stage was running")
        err.print(f"[bold red]interrupted[/]: {stopped}; finished stages are kept")
    err.print(f"artifacts: {path_text(manifest.dir)}", soft_wrap=True)  # _ui.path_shown: control chars shown
    report(records, as_json=as_json, payload=payload, strict=strict,
           title=f"nsa-run {manifest.data['run_id']} ({machine.device}, {profile})")
    sys.stdout.flush()


def run_broke(manifest: RunManifest, e: Exception) -> None:
    """The runner itself could not go on (a full disk, a manifest someone broke): put back a
    rerun's earlier result, mark the run incomplete where the disk still allows it, exit 2.
    The manifest on disk is always a complete earlier version (atomic writes), so a later run
    is never blocked by this one."""
    waiting = manifest.abandon()
    what = f"{e.strerror or e}" if isinstance(e, OSError) else str(e)
    try:
        manifest.set_fields(incomplete=f"the runner stopped: {what}", finished=None)
    except (OSError, ManifestError):
        pass
    if waiting:  # "earlier runs are untouched" would not be true: say where the earlier result is
        fail(f"run {manifest.dir.name} is incomplete: {what}; the earlier result could not be put back yet "
             f"({', '.join(waiting)}, recorded in manifest.json's pending)",
             ("free some space" if _disk_full(e) else "fix what is named above") +
             ", then rerun: the next nsa-run stage / oneshot into this --out puts it back")
    if manifest.back_unnoted:  # put back, but the manifest could not say so (round 19 A U-4)
        fail(f"run {manifest.dir.name} is incomplete: {what}; the earlier {', '.join(manifest.back_unnoted)} result "
             "is back in place (manifest.json's pending still names its move: the next nsa-run stage / oneshot "
             "into this --out drops it)", _disk_hint(e) if isinstance(e, OSError) else "nothing else was changed")
    fail(f"run {manifest.dir.name} is incomplete: {what}",
         _disk_hint(e) if isinstance(e, OSError) else "nothing else was changed")


def finish_run(manifest: RunManifest, err) -> None:
    """summary.md, summary.json and junit.xml over the whole run, on every exit path.

    Called while the run's closing notes Ctrl-C / TERM / HUP (``_Closing``): one that comes while
    they are written ends the run as interrupted once they are (its handler is left as it is here:
    the SIG_IGN this set dropped it, round 13 B-B7). A failure to write them is reported, never
    hidden, and does not change the run's exit code (the manifest holds every result)."""
    try:
        data = manifest.data
        write_run_reports(manifest.dir, data)
        try:  # what they were written from: ``nsa-run report`` writes them again when the stages differ
            manifest.set_fields(reports_of=reports_digest(data))
        except (OSError, ManifestError):  # a full disk: the manifest's own next write names it
            pass
        # a declared case table junit.xml could not use (a row of the wrong length): named, never fatal
        for line in case_table_problems(manifest.data, manifest.dir):
            err.print(f"[yellow]note:[/] {plain_text(line)}", soft_wrap=True)
    except (OSError, ValueError) as e:
        err.print(f"[bold red]summary.md / junit.xml not written:[/] {escape(str(e))}")


def current_run_id() -> str:
    return run_id()
