"""``nsa-run compare A [B]``: what changed from run A to run B, and/or a run against a baseline.

A and B are run ids under ``--out`` or paths of run folders. Marks as in ``asv compare``:
``+`` worse, ``-`` better, ``!`` newly failing, ``*`` fixed, ``x`` not comparable, ``~`` beyond
the factor but within noise (see ``nsa_runner.compare``). Output: a rich table per section,
``--markdown`` (GitHub table) or ``--json``. Exit 1 when a regression (``+`` or ``!``) is
flagged, 2 for unusable input (nothing is written then), else 0.

``--baseline FILE`` adds the ``baseline`` section: B (or A alone when B is omitted) against
the figures recorded for its GPU model (docs/baselines.md). ``--save-baseline FILE`` records
the timing figures of B (or A) as a new baseline file; an existing file is never replaced.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer
from rich.table import Table

from nsa_runner import baseline as bl
from nsa_runner._readers import ArtifactError, Run, resolve_run
from nsa_runner._ui import err_console, fail, out_console, path_text, plain_text, shown
from nsa_runner.commands import _common as c
from nsa_runner.compare import (
    MARKS,
    SECTIONS,
    Comparison,
    Settings,
    compare_runs,
    fmt,
    fmt_ratio,
    run_info,
    running_notes,
    title,
    to_markdown,
    visible_rows,
)

THRESHOLD = typer.Option("10%", "--threshold", help="Timing noise threshold: flag B/A beyond 1+t (e.g. 10% or 0.1).")
PARITY_FACTOR = typer.Option(2.0, "--parity-factor", help="Flag parity errors worse by more than this factor.")
BASELINE = typer.Option(None, "--baseline", help="Check B (or A alone) against this baseline file (docs/baselines.md).")


SAVE_BASELINE = typer.Option(None, "--save-baseline",
                             parser=c.path_option("the new baseline file, e.g. --save-baseline h100.json"),
                             help="Record the timing figures of B (or A) as a NEW baseline file.")
SHOW_ALL = typer.Option(False, "--all", help="Show every row (default: only rows with a mark or a change).")
ONLY_CHANGED = typer.Option(False, "--only-changed", hidden=True, help="The default now; kept for old scripts.")
MARKDOWN = typer.Option(False, "--markdown", help="GitHub markdown on stdout.")
RUN_A = typer.Argument(..., metavar="A", help="Run A (before): a run id under --out, or a run folder.")
RUN_B = typer.Argument(None, metavar="B", help="Run B (after). May be omitted with --baseline / --save-baseline.")

MARK_STYLE = {"+": "bold red", "!": "bold red", "-": "green", "*": "bold green", "x": "yellow", "~": "dim"}
HINT = "give a run id under --out (see its folder names) or the path of a run folder"


def parse_threshold(text: str) -> float:
    """'10%' or '0.1' -> 0.1. Raises ValueError."""
    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise ValueError(f"--threshold {shown(text)} is not a number or a percentage (e.g. 10% or 0.1)") from None
    if not (v >= 0 and v < 100):
        raise ValueError(f"--threshold {shown(text)} must be between 0 and 100x")
    return v


def _open(arg: str, out: Path, which: str) -> Run:
    try:
        return Run.open(resolve_run(arg, out))
    except ArtifactError as e:
        fail(f"run {which}: {e}", HINT)


def _verdict(cmp: Comparison, con) -> None:
    verdict = cmp.verdict()
    con.print(f"[bold red]{plain_text(verdict)}[/]" if cmp.regressions else f"[bold]{plain_text(verdict)}[/]")


def render(cmp: Comparison, show_all: bool = False, con=None) -> None:
    """The comparison for people: the verdict first, notes, a rich table per section with the rows
    that changed (every row with ``show_all``), the marks; the verdict again as the last line."""
    con = con or out_console()
    con.print(f"[bold]{plain_text(title(cmp))}[/]")
    _verdict(cmp, con)
    for n in cmp.notes:
        con.print(f"[yellow]note:[/] {plain_text(n)}")
    rows = visible_rows(cmp, show_all)
    hidden = len(cmp.rows) - len(rows)
    if hidden:
        con.print(f"[dim]{hidden} unchanged row(s) not shown (--all shows them)[/]")
    for section in SECTIONS:
        sec = [r for r in rows if r.section == section]
        if not sec:
            continue
        t = Table(title=section, title_justify="left", show_lines=False)
        for col, kw in (("", {}), ("source", {"no_wrap": True}), ("key", {"overflow": "fold", "ratio": 3}),
                        ("metric", {"no_wrap": True}),
                        ("A", {"justify": "right"}), ("B", {"justify": "right"}), ("B/A", {"justify": "right"}),
                        ("note", {"overflow": "fold", "ratio": 3})):
            t.add_column(col, **kw)
        for r in sec:
            style = MARK_STYLE.get(r.mark, "")
            mark = f"[{style}]{plain_text(r.mark)}[/]" if style else plain_text(r.mark)
            # every cell comes from files (CSV keys, baselines, manifests): escape sequences and
            # control characters stripped, rich markup escaped (_ui.plain_text)
            t.add_row(mark, plain_text(r.source), plain_text(r.key), plain_text(r.metric),
                      plain_text(fmt(r.a, r.metric)), plain_text(fmt(r.b, r.metric)), plain_text(fmt_ratio(r.ratio)),
                      plain_text(r.note))
        con.print(t)
    con.print("marks: " + ", ".join(f"{m} {w}" for m, w in MARKS.items()), style="dim")
    _verdict(cmp, con)


def compare(
    a: str = RUN_A,
    b: str = RUN_B,
    out: Path = c.OUT,
    threshold: str = THRESHOLD,
    parity_factor: float = PARITY_FACTOR,
    baseline: Path = BASELINE,
    save_baseline: Path = SAVE_BASELINE,
    show_all: bool = SHOW_ALL,
    only_changed: bool = ONLY_CHANGED,
    markdown: bool = MARKDOWN,
    as_json: bool = c.JSON,
) -> None:
    """Compare two runs: the verdict, then what changed (status, parity errors, timings as B/A); exit 1 on a
    regression. --all shows unchanged rows too."""
    if markdown and as_json:
        fail("--markdown and --json are exclusive: pick one output")
    try:
        settings = Settings(parse_threshold(threshold), parity_factor)
    except ValueError as e:
        fail(str(e))
    if b is None and baseline is None and save_baseline is None:
        fail("compare needs run B, or --baseline FILE (check one run), or --save-baseline FILE",
             "e.g. nsa-run compare 40e81ff 7fcb68d, or nsa-run compare 7fcb68d --baseline h100.json")
    base = None
    if baseline is not None:
        try:
            base = bl.load(baseline)
        except ArtifactError as e:
            fail(f"--baseline: {e}", "see docs/baselines.md")
    # lexists, not Path.exists: that raised OSError for a name too long (ENAMETOOLONG), an anonymous
    # "OSError (unexpected)"; such a name is refused by the write below, naming it
    if save_baseline is not None and os.path.lexists(save_baseline):
        fail(f"--save-baseline {save_baseline} exists: nothing was overwritten", "choose a new file name")
    run_a = _open(a, out, "A")
    run_b = _open(b, out, "B") if b is not None else None
    subject = run_b or run_a
    try:
        cmp = compare_runs(run_a, run_b, settings) if run_b is not None else Comparison(None, run_info(subject),
                                                                                         settings=settings)
        if base is not None:
            rows, notes = bl.check(subject, base)
            cmp.rows += rows
            cmp.notes += notes
        figures, left_out = None, []
        if save_baseline is not None:
            figures, left_out = bl.figures_of(subject, settings.threshold or bl.DEFAULT_TOLERANCE)
        if run_b is None:  # (compare_runs adds them for two runs)
            cmp.notes += running_notes({"A": run_a})
    except ArtifactError as e:
        fail(str(e), "nothing was written; repair or move the broken file, or compare other runs")
    saved = None
    if figures is not None:
        for note in left_out:
            err_console().print(f"note: {plain_text(note)}", soft_wrap=True)
        try:
            saved = bl.save_new(save_baseline, figures)
        except bl.BaselineError as e:  # exists by now, no such folder
            fail(f"--save-baseline {e}", "nothing was written; choose a new file name")
        except OSError as e:  # unwritable place (/proc, read-only), disk full: no temp file is left
            fail(f"cannot write --save-baseline {save_baseline}: {e.strerror or e}",
                 "nothing was written; choose a new file in a writable folder with free space")
    if saved is not None:
        err_console().print(f"baseline written: {path_text(saved)} ({plain_text(subject.machine()['label'])})")
    if as_json:
        print(json.dumps(cmp.to_dict(), indent=2, default=str))
    elif markdown:
        print(to_markdown(cmp, show_all))
    else:
        render(cmp, show_all)
    raise typer.Exit(cmp.exit_code)


def register(app: typer.Typer) -> None:
    app.command("compare")(compare)
