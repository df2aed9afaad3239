"""Console helpers shared by the commands: one ``fail`` for usage errors, rich progress,
the results table and the final counts line.

Diagnostics and progress go to stderr; tables go to stdout unless ``--json`` (then stdout is
JSON only and the counts line goes to stderr).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Column, Table

from nsa_runner._text import CONTROL as _CONTROL
from nsa_runner._text import clip, shown, word_shown, written_out  # noqa: F401 - shown: re-exported for the commands
from nsa_runner.executor import Observer, StageRecord
from nsa_runner.registry import StageEntry
from nsa_runner.results import counts
from nsa_runner.results import counts_line as _line
from nsa_runner.stage import Status

STATUS_STYLE = {
    Status.PASS: "bold green",
    Status.FAIL: "bold red",
    Status.ERROR: "bold red",
    Status.TIMEOUT: "bold red",
    Status.SKIP: "yellow",
}




def plain_text(text: object) -> str:
    """Plugin- or file-provided text made safe for a rich console: escape sequences and control
    characters removed, rich markup escaped (printed literally; the consoles also never turn
    ``:smile:`` codes into emoji)."""
    return escape(_CONTROL.sub("", str(text)))


def path_shown(path: object) -> str:
    """A path as a terminal line names it, one rule for every printed path (``-> PATH``, ``artifacts:``,
    ``report:``): as it is when every character of it is printable (copy-pasteable), else its repr, as
    the error lines show user input (``shown``): ``'runs\\x1b[0m/52a815b'``, each control character
    (newline, C1, the bidi / format characters) written out, never dropped (round 19 A19-R2: the
    ESC of ``--out $'runs\\x1b[0m'`` was stripped and the line named ANOTHER run's folder ``runs/...``;
    a newline split the line). Plain text: callers printing on a rich console use ``path_text``."""
    return word_shown(path)


def path_text(path: object) -> str:
    """``path_shown`` with rich markup escaped, for a rich console line."""
    return escape(path_shown(path))


TABLE_REASON_CHARS = 2000  # a reason's characters in the terminal table (the files keep it whole)
MESSAGE_CHARS = 2000  # an error line's / hint's characters at most (a last net: inputs are clipped first)

MIN_WIDTH = 40  # COLUMNS=0 gave rich a width of 0: every table and line came out empty


class _PipeSafe:
    """``sys.stdout`` / ``sys.stderr`` as seen at each write, except that a write hitting a closed
    pipe (``nsa-run oneshot 2>&1 | head -1``) sends that fd to /dev/null for the rest of the run:
    the run goes on and records everything (its exit code stays its own) instead of dying on the
    next progress line. SIGPIPE stays ignored (Python's default), so the write fails with EPIPE."""

    def __init__(self, name: str):
        self._name = name

    def _stream(self):
        import sys

        return getattr(sys, self._name)

    def __getattr__(self, attr):
        return getattr(self._stream(), attr)

    def _closed_pipe(self) -> None:
        to_devnull(self._stream())

    def _lost(self) -> tuple[type[BaseException], ...]:
        # stderr carries diagnostics only (the manifest records everything): any write error (a
        # full disk under ``2>>log``, ``2>/dev/full``) sends it to /dev/null and the run goes on;
        # stdout: a reader gone only (other errors are the output lost: cli.main's OutputError)
        return (OSError,) if self._name == "stderr" else (BrokenPipeError,)

    def write(self, text: str) -> int:
        try:
            return self._stream().write(text)
        except self._lost():
            self._closed_pipe()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream().flush()
        except self._lost():
            self._closed_pipe()


def to_devnull(stream) -> None:
    """Point ``stream``'s fd at /dev/null (its reader is gone): later writes succeed and go nowhere."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return
    nul = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(nul, fd)
    finally:
        os.close(nul)
    try:  # what the stream still holds goes to /dev/null now
        stream.flush()
    except OSError:
        pass


class OutputError(Exception):
    """The command's own output (stdout) cannot be written: a full disk, ``> /dev/full``, an I/O error."""


class GuardedStdout:
    """``sys.stdout`` of the ``nsa-run`` script (``cli.main``), for ``print`` and the consoles alike: a
    reader gone (``| head -1``, EPIPE) sends stdout to /dev/null and the command keeps its own exit
    code (a compare verdict of 0 or 1 stays what it is); any other write error raises OutputError,
    which ``cli.main`` reports in one line (exit 2): the output is lost, and no verdict may be read
    from an exit code whose output never arrived."""

    def __init__(self, stream):
        self._s = stream

    def __getattr__(self, attr):
        return getattr(self._s, attr)

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except BrokenPipeError:
            to_devnull(self._s)
            return len(args[0]) if args else None
        except OSError as e:
            raise OutputError(e.strerror or str(e)) from None

    def write(self, text: str) -> int:
        return self._call(self._s.write, text)

    def flush(self) -> None:
        self._call(self._s.flush)


def _console(stream: str, **kw) -> Console:
    c = Console(file=_PipeSafe(stream), highlight=False, emoji=False, **kw)
    if c.width < MIN_WIDTH:
        c.width = MIN_WIDTH
    return c


def err_console() -> Console:
    return _console("stderr")


def out_console() -> Console:
    c = _console("stdout", soft_wrap=False)
    cols = os.environ.get("COLUMNS", "")
    if not c.is_terminal and not (cols.isdigit() and int(cols) >= MIN_WIDTH):  # logs / CI / pipes: do not
        # fold at 80 (nor at a COLUMNS too small to hold a table)
        c = _console("stdout", soft_wrap=False, width=140)
    return c


def fail(message: str, hint: str = "", exit_code: int = 2) -> NoReturn:
    """Print ``error: message`` (and the hint) to stderr and exit with ``exit_code`` (usage: 2)."""
    c = err_console()
    # one line, whatever a path or a file's text in it holds, each control character written out, never dropped
    c.print(f"[bold red]error:[/] {plain_text(written_out(clip(message, MESSAGE_CHARS)))}", soft_wrap=True)
    # (paths stay copy-pasteable)
    if hint:
        c.print(f"[dim]hint:[/] {plain_text(written_out(clip(hint, MESSAGE_CHARS)))}", soft_wrap=True)
    raise typer.Exit(exit_code)


def status_text(status: Status) -> str:
    return f"[{STATUS_STYLE[status]}]{status.value}[/]"


class ProgressObserver(Observer):
    """Live progress on stderr.

    On a terminal: an overall bar (stage k of N, elapsed) above one line per stage with its
    elapsed time and, while it runs, its last log line (the stage's own progress). Without a
    terminal (CI, ``| tee``, a file): one plain line when a stage starts and one when it
    finishes, each written and flushed as it happens — never held back until the end.
    """

    def __init__(self, console: Console, total: int = 0):
        self.console = console
        self.total = total
        self.live = console.is_terminal
        self.index: dict[str, int] = {}
        self.t0 = time.monotonic()
        self.tasks: dict[str, int] = {}
        if self.live:
            self.progress = Progress(
                SpinnerColumn(finished_text="•"),
                TextColumn("{task.description}", table_column=Column(no_wrap=True, min_width=14)),
                BarColumn(bar_width=20),
                TimeElapsedColumn(),
                TextColumn("{task.fields[status]}", table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1)),
                console=console,
                transient=False,
            )
            self.overall = self.progress.add_task(self._overall_text(0, ""), total=max(total, 1), status="")

    # --- helpers -------------------------------------------------------------------------
    def _k(self, entry: StageEntry) -> int:
        if entry.name not in self.index:
            self.index[entry.name] = len(self.index) + 1
        return self.index[entry.name]

    def _overall_text(self, k: int, running: str) -> str:
        what = f"running [bold]{plain_text(running)}[/]" if running else "done" if k >= self.total else ""
        return f"[bold]stage {k} of {self.total}[/] {what}"

    def _plain(self, text: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        # plain print (no markup), but a stage's reason never sends escape sequences to the terminal
        print(f"{stamp} +{time.monotonic() - self.t0:6.1f}s {_CONTROL.sub('', text)}", file=self.console.file,
              flush=True)

    def __enter__(self) -> ProgressObserver:
        if self.live:
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.live:
            self.progress.stop()

    # --- Observer --------------------------------------------------------------------------
    def on_start(self, entry: StageEntry) -> None:
        k = self._k(entry)
        if not self.live:
            self._plain(f"[{k}/{self.total}] {entry.name}: started")
            return
        self.progress.update(self.overall, description=self._overall_text(k, entry.name), completed=k - 1)
        self.tasks[entry.name] = self.progress.add_task(f"[bold]{entry.name}[/]", total=None,
                                                        status="[dim]running[/]")

    def on_tick(self, entry: StageEntry, elapsed: float, last_line: str) -> None:
        task = self.tasks.get(entry.name)
        if self.live and task is not None:
            self.progress.update(task, status=f"[dim]{plain_text(last_line[:80])}[/]")

    def on_set_aside(self, entry: StageEntry, moved: Path) -> None:
        text = (f"earlier {entry.name} result, recorded in this folder by another nsa-run meanwhile, set aside in "
                f"{path_shown(moved)} (put back if this run does not finish)")
        if not self.live:
            self._plain(text)
        else:
            self.progress.console.print(plain_text(text), soft_wrap=True)

    def on_finish(self, entry: StageEntry, record: StageRecord) -> None:
        k = self._k(entry)
        if not self.live:
            reason = " ".join(record.reason.split())[:160]
            self._plain(f"[{k}/{self.total}] {entry.name}: {record.status.value} in {record.duration_s:.1f}s"
                        + (f" — {reason}" if reason else ""))
            return
        task = self.tasks.get(entry.name)
        if task is None:  # skipped or broken: never started, show it once
            task = self.tasks[entry.name] = self.progress.add_task(f"[bold]{entry.name}[/]", total=None,
                                                                   status="")
        self.progress.update(task, total=1, completed=1,
                             status=f"{status_text(record.status)} {plain_text(record.reason[:80])}")
        self.progress.stop_task(task)
        self.progress.update(self.overall, completed=k, description=self._overall_text(k, ""))


def results_table(records: list[StageRecord], title: str = "") -> Table:
    t = Table(title=title or None, show_lines=False)
    t.add_column("order", justify="right")
    t.add_column("stage", style="bold", no_wrap=True)
    t.add_column("status")
    t.add_column("time", justify="right")
    t.add_column("reason", overflow="fold")
    for r in records:
        reason = r.reason
        if r.status is Status.SKIP and r.hint:
            reason = f"{reason} (fix: {r.hint})"
        if r.status is Status.SKIP and r.strict_fail:
            reason = f"{reason} [counts as failure under --strict]"
        t.add_row("-" if r.order is None else str(r.order), r.name, status_text(r.status),
                  f"{r.duration_s:.1f}s", plain_text(clip(reason, TABLE_REASON_CHARS)))
    return t


def counts_line(records: list[StageRecord]) -> str:
    return _line(counts(records))


def report(records: list[StageRecord], *, as_json: bool, payload: dict, strict: bool,
           title: str = "") -> None:
    """The end of a run: table (or JSON) on stdout, then the counts line as the very last line."""
    out, err = out_console(), err_console()
    strict_skips = [r.name for r in records if r.status is Status.SKIP and r.strict_fail] if strict else []
    if as_json:
        print(json.dumps(payload, indent=2, default=str))
        if strict_skips:
            err.print(f"--strict: skips that count as failures: {', '.join(strict_skips)}")
        err.print(counts_line(records))
        return
    out.print(results_table(records, title))
    if strict_skips:
        out.print(f"--strict: skips that count as failures: {', '.join(strict_skips)}")
    out.print(counts_line(records))
