"""Console helpers shared by the commands: one ``fail`` for usage errors, rich progress,
the results table and the final counts line.

Diagnostics and progress go to stderr; tables go to stdout unless ``--json`` (then stdout is
JSON only and the counts line goes to stderr).
"""

from __future__ import annotations

import json
import os
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Column, Table

from nsa_runner.executor import Observer, StageRecord, counts
from nsa_runner.registry import StageEntry
from nsa_runner.stage import Status

STATUS_STYLE = {
    Status.PASS: "bold green",
    Status.FAIL: "bold red",
    Status.ERROR: "bold red",
    Status.TIMEOUT: "bold red",
    Status.SKIP: "yellow",
}


def err_console() -> Console:
    return Console(stderr=True, highlight=False)


def out_console() -> Console:
    c = Console(highlight=False, soft_wrap=False)
    if not c.is_terminal and "COLUMNS" not in os.environ:  # logs / CI / pipes: do not fold at 80
        c = Console(highlight=False, soft_wrap=False, width=140)
    return c


def fail(message: str, hint: str = "", exit_code: int = 2) -> NoReturn:
    """Print ``error: message`` (and the hint) to stderr and exit with ``exit_code`` (usage: 2)."""
    c = err_console()
    c.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)  # paths stay copy-pasteable
    if hint:
        c.print(f"[dim]hint:[/] {escape(hint)}", soft_wrap=True)
    raise typer.Exit(exit_code)


def status_text(status: Status) -> str:
    return f"[{STATUS_STYLE[status]}]{status.value}[/]"


class ProgressObserver(Observer):
    """Live progress on stderr: one line per stage with elapsed time and its last log line."""

    def __init__(self, console: Console):
        self.progress = Progress(
            SpinnerColumn(finished_text="•"),
            TextColumn("{task.description}", table_column=Column(no_wrap=True, min_width=14)),
            TimeElapsedColumn(),
            TextColumn("{task.fields[status]}", table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1)),
            console=console,
            transient=False,
        )
        self.tasks: dict[str, int] = {}

    def __enter__(self) -> ProgressObserver:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def on_start(self, entry: StageEntry) -> None:
        self.tasks[entry.name] = self.progress.add_task(f"[bold]{entry.name}[/]", total=None,
                                                        status="[dim]running[/]")

    def on_tick(self, entry: StageEntry, elapsed: float, last_line: str) -> None:
        task = self.tasks.get(entry.name)
        if task is not None:
            self.progress.update(task, status=f"[dim]{escape(last_line[:80])}[/]")

    def on_finish(self, entry: StageEntry, record: StageRecord) -> None:
        task = self.tasks.get(entry.name)
        if task is None:  # skipped or broken: never started, show it once
            task = self.tasks[entry.name] = self.progress.add_task(f"[bold]{entry.name}[/]", total=None,
                                                                   status="")
        self.progress.update(task, total=1, completed=1,
                             status=f"{status_text(record.status)} {escape(record.reason[:80])}")
        self.progress.stop_task(task)


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
                  f"{r.duration_s:.1f}s", escape(reason))
    return t


def counts_line(records: list[StageRecord]) -> str:
    c = counts(records)
    return f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped"


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
