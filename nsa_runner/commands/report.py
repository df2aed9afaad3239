"""``nsa-run report RUN``: write report.html (self-contained, plots embedded) into the run folder,
and summary.md when the run has none (an existing summary.md, the summary stage's, is kept).

RUN is a run id under ``--out`` or the path of a run folder. Exit 0 when the report was
written (whatever the run's own result), 2 when the run or one of its files is unusable; then
nothing is written.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape

from nsa_runner import report as report_mod
from nsa_runner._readers import ArtifactError, resolve_run
from nsa_runner._ui import fail, out_console
from nsa_runner.commands import _common as c

RUN = typer.Argument(..., metavar="RUN", help="A run id under --out, or the path of a run folder.")


def report(
    run: str = RUN,
    out: Path = c.OUT,
    as_json: bool = c.JSON,
) -> None:
    """Write report.html (and summary.md if absent) into a run folder."""
    try:
        folder = resolve_run(run, out)
        info = report_mod.write(folder)
    except ArtifactError as e:
        fail(str(e), "nothing was written; repair or move the broken file aside, then rerun")
    except OSError as e:
        fail(f"cannot write the report: {e.strerror or e}", "check the run folder's permissions")
    if as_json:
        print(json.dumps({"schema_version": 1, **info}, indent=2))
    else:
        con = out_console()
        con.print(f"report: {escape(info['report'])}")
        kept = "written (the run had none)" if info["summary_written"] else "kept (the summary stage's)"
        con.print(f"summary.md: {escape(info['summary'])} {kept}")
        k = info["counts"]
        con.print(f"{k['passed']} passed, {k['failed']} failed, {k['skipped']} skipped")
    raise typer.Exit(0)


def register(app: typer.Typer) -> None:
    app.command("report")(report)
