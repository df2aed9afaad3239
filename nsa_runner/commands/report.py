"""``nsa-run report RUN``: write report.html (self-contained, plots embedded) into the run folder,
and summary.md when the run has none (an existing summary.md, written when the run ended, is kept
while it agrees with manifest.json; summary.md / junit.xml that disagree are written again from it).

RUN is a run id under ``--out`` or the path of a run folder. Exit 0 when the report was
written (whatever the run's own result), 2 when the run or one of its files is unusable; then
nothing is written.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import typer

from nsa_runner import baseline as bl
from nsa_runner import report as report_mod
from nsa_runner._readers import ArtifactError, Run, resolve_run
from nsa_runner._ui import err_console, fail, out_console, plain_text
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
    except ArtifactError as e:  # no such run (yet: a run that is starting has no folder until its manifest)
        fail(str(e), "nothing was written")
    try:
        stale = refresh_run_reports(folder)
        info = report_mod.write(folder)
    except ArtifactError as e:
        fail(str(e), "nothing was written; repair or move the broken file aside, then rerun")
    except OSError as e:
        fail(f"cannot write the report: {e.strerror or e}", c._disk_hint(e))
    if as_json:
        print(json.dumps({"schema_version": 1, **info, "rewritten": stale}, indent=2))
    else:
        con = out_console()
        con.print(f"report: {plain_text(info['report'])}", soft_wrap=True)
        if stale:
            kept = f"rewritten ({', '.join(stale)} disagreed with manifest.json)"
        elif info["summary_written"]:
            kept = "written (the run had none)"
        else:
            kept = "kept (written when the run ended)"
        con.print(f"summary.md: {plain_text(info['summary'])} {kept}", soft_wrap=True)
        # a run that did not finish says so before its counts (0 passed of a dead runner is no verdict)
        if info.get("unfinished"):
            con.print(f"[bold red]UNFINISHED[/]: {plain_text(info['unfinished'])}", soft_wrap=True)
        elif info.get("running"):  # another nsa-run is at work in it: the counts are so far, no verdict
            con.print(f"[bold yellow]RUNNING[/]: {plain_text(info['running'])}; the counts below are of the "
                      "stages finished so far", soft_wrap=True)
        elif info.get("interrupted"):
            con.print("[bold red]INTERRUPTED[/]: the run was stopped (Ctrl-C / cancel); later stages are missing")
        k = info["counts"]
        con.print(f"{k['passed']} passed, {k['failed']} failed, {k['skipped']} skipped")
    for line in info.get("problems", []):  # sections left out of report.html, each naming its files
        err_console().print(f"[yellow]note:[/] {plain_text(line)}", soft_wrap=True)
    raise typer.Exit(0)


def refresh_run_reports(folder: Path) -> list[str]:
    """summary.md / junit.xml written from another state of the run than manifest.json's (a runner
    stopped between a record and its closing reports left the earlier run's: PASS for a stage now
    recorded FAIL) are written again from the manifest, with summary.json; returns their names.
    The runner records what it wrote them from (``reports_of``); a run folder without that note
    keeps its files as they are. Nothing is done while an nsa-run is still at work in the folder
    (its own end writes them), nor for a manifest that cannot be read (``report_mod.write`` names it)."""
    from nsa_runner.artifacts import ManifestError, load_manifest, still_running
    from nsa_runner.results import JUNIT_XML, SUMMARY_MD
    from nsa_runner.results.reports import write_run_reports

    folder = Path(folder)
    try:
        m = load_manifest(folder)
    except (ManifestError, OSError):
        return []
    written_of = m.get("reports_of")
    if not isinstance(written_of, str) or still_running(m):
        return []
    try:
        if written_of == c.reports_digest(m):
            return []
    except (ValueError, TypeError):
        return []
    from nsa_runner.results import SUMMARY_JSON

    names = (SUMMARY_MD, JUNIT_XML, SUMMARY_JSON)
    if any(os.path.lexists(folder / n) and not stat.S_ISREG(os.lstat(folder / n).st_mode) for n in names):
        return []  # a link or a special file there is not the runner's: neither read nor replaced
    stale = [name for name in (SUMMARY_MD, JUNIT_XML) if (folder / name).is_file()]
    if not stale:
        return []
    write_run_reports(folder, m)
    try:
        from nsa_runner.manifest import RunManifest

        RunManifest(folder, m).set_fields(reports_of=c.reports_digest(m))
    except ManifestError:
        pass
    return stale


# ---- the end of ``oneshot`` (called from nsa_runner/commands/oneshot.py) ------------------------

BASELINE = typer.Option(None, "--baseline",
                        help="Check decode / kernel figures against this baseline file at the end (docs/baselines.md).")


def load_baseline(path: Path | None) -> dict | None:
    """Validate ``--baseline`` before anything runs (exit 2 on a bad file)."""
    if path is None:
        return None
    try:
        return bl.load(path)
    except ArtifactError as e:
        fail(f"--baseline: {e}", "see docs/baselines.md")


def finish_oneshot(folder: Path, code: int, baseline: dict | None) -> int:
    """Write report.html (and summary.md if absent) and check the baseline; returns the exit code.

    The run's own code is kept (a failure is never hidden); a baseline regression turns 0 into 1.
    Messages go to stderr; the caller then prints the results (table or JSON) and the counts line.
    """
    from nsa_runner.commands.compare import render
    from nsa_runner.compare import Comparison, run_info

    err = err_console()
    try:
        info = report_mod.write(folder)
        err.print(f"report: {plain_text(info['report'])}", soft_wrap=True)
    except (ArtifactError, OSError) as e:
        err.print(f"[yellow]report not written:[/] {plain_text(e)}")
    if baseline is not None:
        try:
            run = Run.open(folder)
            rows, notes = bl.check(run, baseline)
        except ArtifactError as e:
            err.print(f"[bold red]baseline check impossible:[/] {plain_text(e)}")
            return code or 1
        cmp = Comparison(None, run_info(run), rows=rows, notes=notes)
        render(cmp, False, err)
        if cmp.regressions and code == 0:
            err.print("[bold red]exit code 1[/]: baseline regression")
            code = 1
    return code


def refresh_report(folder: Path, code: int) -> int:
    """After ``nsa-run stage X``: rewrite report.html when the run folder has one (so it shows the
    new result); a run without one (a lone ``stage``) gets none. Returns ``code`` unchanged."""
    if (folder / report_mod.REPORT_NAME).exists():
        try:
            info = report_mod.write(folder)
            err_console().print(f"report: {plain_text(info['report'])}", soft_wrap=True)
        except (ArtifactError, OSError) as e:
            err_console().print(f"[yellow]report not refreshed:[/] {plain_text(e)}")
    return code


def register(app: typer.Typer) -> None:
    app.command("report")(report)
