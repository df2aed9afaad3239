"""``nsa-run report RUN``: write report.html (self-contained, plots embedded) into the run folder,
and whichever of summary.md / junit.xml / summary.json the run has not (an existing summary.md,
written when the run ended, is kept while it agrees with manifest.json; summary.md / junit.xml /
summary.json that disagree are written again from it; a link / folder / special file among them is
left as it is and named; one that is missing and not written, while an nsa-run is still at work in
the folder, is named too).

RUN is a run id under ``--out`` or the path of a run folder. Exit 0 when the report was
written (whatever the run's own result), 2 when the run or one of its files is unusable; then
nothing is written (everything is rendered before the first write). A write that fails part-way
(a full disk, report.html a folder) names its path and what was already written.
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
from nsa_runner._ui import err_console, fail, out_console, path_shown, path_text, plain_text
from nsa_runner.commands import _common as c
from nsa_runner.results import SUMMARY_MD

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
    try:  # everything rendered before the first write: a broken file leaves the folder as it was
        plan = plan_run_reports(folder)
        prepared = report_mod.prepare(folder)
    except ArtifactError as e:
        fail(str(e), "nothing was written; repair or move the broken file aside, then rerun")
    except ValueError as e:  # a manifest the summaries cannot show
        fail(f"cannot write the summaries of {folder}: {e}", "nothing was written")
    except OSError as e:
        fail(f"cannot read {e.filename or folder}: {e.strerror or e}", "nothing was written")
    if plan is not None and SUMMARY_MD in plan.added:  # written from the manifest with the other two
        prepared["summary_text"] = None
    written: list[str] = []
    try:
        info = report_mod.commit(prepared, written)
        if plan is not None:
            plan.write(written)
    except OSError as e:
        where = _target_of(e, folder if written else folder / report_mod.REPORT_NAME)
        done = (f"{', '.join(written)} written before it; the others are as they were" if written
                else "nothing was written")
        fail(f"cannot write {where}: {e.strerror or e}", f"{done}; {c._disk_hint(e)}")
    stale = plan.rewritten if plan is not None else []
    added = plan.added if plan is not None else []
    if SUMMARY_MD in added:  # written by the plan, from the manifest, rather than by report_mod
        info["summary_written"] = True
    odd = odd_reports(folder)
    # still missing (not written: an nsa-run at work in the folder writes them at its end): said,
    # never "kept" (round 15 B U1: a deleted junit.xml stayed missing under "summary.md ... kept")
    left = [n for n in _names() if n not in odd and not os.path.lexists(folder / n)]
    if as_json:
        print(json.dumps({"schema_version": 1, **info, "rewritten": stale + added,
                          "left_alone": odd, "not_written": left}, indent=2))
    else:
        con = out_console()
        con.print(f"report: {path_text(info['report'])}", soft_wrap=True)
        if SUMMARY_MD in odd:
            kept = "left as it is (not a regular file: a link, folder or special file is not the runner's)"
        elif stale:
            kept = "rewritten (" + "; ".join(
                [f"{', '.join(stale)} disagreed with manifest.json"]
                + ([f"{', '.join(added)} missing, written from it"] if added else [])) + ")"
        elif info["summary_written"]:
            kept = "written (the run had none)"
        elif SUMMARY_MD in left:
            kept = "missing, not written"
        else:
            kept = "kept (written when the run ended)"
        con.print(f"summary.md: {path_text(info['summary'])} {kept}", soft_wrap=True)
        others = [n for n in added if n != SUMMARY_MD]
        if others and not stale:  # the run's copies of the others restored; summary.md said above
            con.print(f"{', '.join(others)}: missing, written from manifest.json", soft_wrap=True)
        # a run that did not finish says so before its counts (0 passed of a dead runner is no verdict)
        if info.get("unfinished"):
            con.print(f"[bold red]UNFINISHED[/]: {plain_text(info['unfinished'])}", soft_wrap=True)
        elif info.get("running"):  # another nsa-run is at work in it: the counts are so far, no verdict
            con.print(f"[bold yellow]RUNNING[/]: {plain_text(info['running'])}; the counts below are of the "
                      "stages finished so far", soft_wrap=True)
        elif info.get("interrupted"):
            con.print(f"[bold red]INTERRUPTED[/] {plain_text(info.get('interrupted_line') or '(Ctrl-C / cancel)')}",
                      soft_wrap=True)
        k = info["counts"]
        con.print(f"{k['passed']} passed, {k['failed']} failed, {k['skipped']} skipped")
    # a link / folder / special file among them is named every time, not only when a plan was made (a
    # dangling junit.xml link beside an agreeing summary.md was "kept", left_alone [], round 16 B3)
    if odd:  # reports the runner does not own: named, never followed
        for name in odd:
            err_console().print(f"[yellow]note:[/] {path_text(folder / name)} is not a regular file "
                                "(a link, folder or special file): left as it is, so it may disagree with "
                                "manifest.json; move it aside and rerun nsa-run report to have it written",
                                soft_wrap=True)
    if left:
        why = _why_not_written(folder)
        err_console().print(f"[yellow]note:[/] {', '.join(left)} missing, not written ({why})", soft_wrap=True)
    for line in info.get("problems", []):  # sections left out of report.html, each naming its files
        err_console().print(f"[yellow]note:[/] {plain_text(line)}", soft_wrap=True)
    raise typer.Exit(0)


def _why_not_written(folder: Path) -> str:
    """Why ``plan_run_reports`` wrote no missing summary file."""
    from nsa_runner.artifacts import ManifestError, load_manifest, still_running

    try:
        if still_running(load_manifest(folder)):
            return "an nsa-run is still at work in this run folder: its end writes them"
    except (ManifestError, OSError):
        pass
    return "they cannot be rendered from manifest.json"


def _target_of(e: OSError, fallback: Path) -> str:
    """The path an atomic write failed on (its temporary file renamed onto it: ``filename2``)."""
    for name in (getattr(e, "filename2", None), getattr(e, "filename", None)):
        if name:
            p = Path(os.fsdecode(name))
            if p.name.startswith(".") and p.name.endswith(".tmp"):  # .report.html.XXXX.tmp
                continue
            return path_shown(p)
    return path_shown(fallback)


def _names() -> tuple[str, str, str]:
    from nsa_runner.results import JUNIT_XML, SUMMARY_JSON, SUMMARY_MD

    return (SUMMARY_MD, JUNIT_XML, SUMMARY_JSON)


def odd_reports(folder: Path) -> list[str]:
    """Which of summary.md / junit.xml / summary.json are there but not regular files (a link, a
    folder, a FIFO): not the runner's, so neither read nor replaced."""
    odd = []
    for n in _names():
        try:
            if not stat.S_ISREG(os.lstat(folder / n).st_mode):
                odd.append(n)
        except FileNotFoundError:
            pass
        except OSError:
            odd.append(n)
    return odd


class ReportsPlan:
    """summary.md / junit.xml / summary.json to write again from the manifest, rendered in memory."""

    def __init__(self, folder: Path, m: dict, text: dict[str, str], rewritten: list[str], added: list[str],
                 odd: list[str], record: bool = True):
        self.folder, self.m, self.text = folder, m, text
        self.rewritten, self.added, self.odd = rewritten, added, odd
        self.record = record  # note in the manifest that the three now agree with it

    def write(self, written: list[str]) -> None:
        from nsa_runner.artifacts import ManifestError, write_text
        from nsa_runner.manifest import RunManifest

        for name in self.rewritten + self.added:
            write_text(self.folder / name, self.text[name])
            written.append(name)
        if self.odd or not self.record:  # not recorded as agreeing: the next report names them again
            return
        try:
            RunManifest(self.folder, self.m).set_fields(reports_of=c.reports_digest(self.m))
            written.append("manifest.json")
        except ManifestError:
            pass


def plan_run_reports(folder: Path) -> ReportsPlan | None:
    """summary.md / junit.xml / summary.json written from another state of the run than
    manifest.json's (a runner stopped between a record and its closing reports left the earlier
    run's: PASS for a stage now recorded FAIL; a rerun killed -9 left no runner-died line) are
    rendered again from the manifest, to be written by ``ReportsPlan.write`` (nothing is written
    here). Whichever of the three is there as a regular file, or missing, is written; a link /
    folder / special file is left as it is and named (``odd``). The runner records what it wrote
    them from (``reports_of``); while they agree with it, the missing ones and those whose content
    is not what the runner wrote from it (``_same_content``: a junit.xml replaced by garbage) are
    written, the others kept; in a run folder without that note the files there are kept as they are,
    the missing ones written (a deleted junit.xml or summary.json stayed missing while ``report``
    said "kept": round 15 B U1). None while an nsa-run is still at work in the folder (its own end
    writes them), for a manifest that cannot be read (``report_mod.prepare`` names it), or when
    there is nothing to write."""
    from nsa_runner.artifacts import ManifestError, load_manifest, still_running
    from nsa_runner.results.reports import render_run_reports

    folder = Path(folder)
    try:
        m = load_manifest(folder)
    except (ManifestError, OSError):
        return None
    written_of = m.get("reports_of")
    if still_running(m):
        return None
    try:
        agree = not isinstance(written_of, str) or written_of == c.reports_digest(m)
    except (ValueError, TypeError):
        return None
    odd = odd_reports(folder)
    names = [n for n in _names() if n not in odd]
    present = [n for n in names if os.path.lexists(folder / n)]
    missing = [n for n in names if n not in present]
    if agree and not isinstance(written_of, str):  # no note (an older run): kept as they are, missing written
        if not missing:
            return None
        return ReportsPlan(folder, m, render_run_reports(folder, m), [], missing, odd, record=False)
    try:
        text = render_run_reports(folder, m)
    except ValueError:  # a manifest they cannot show: raised where one must be written (the caller names it)
        if agree and not missing:
            return None
        raise
    if agree:  # the runner's own files of this manifest: kept while their content is what it wrote
        # (a junit.xml replaced by garbage was "kept", and CI read garbage: round 16 B U4)
        changed = [n for n in present if not _same_content(folder / n, n, text[n])]
        if not missing and not changed:
            return None
        return ReportsPlan(folder, m, text, changed, missing, odd, record=False)
    return ReportsPlan(folder, m, text, present, missing, odd)


def _same_content(path: Path, name: str, expected: str) -> bool:
    """Whether the regular file ``path`` holds ``expected`` as the runner writes it (summary.json: the
    same document but for its ``written`` time). Read no further than that needs: a larger file, an
    unreadable one or one swapped for a special file differs."""
    from nsa_runner.artifacts import UnsafeFileError, read_limited
    from nsa_runner.results import SUMMARY_JSON

    want = expected.encode("utf-8", errors="backslashreplace")  # as write_text writes it
    try:
        if name != SUMMARY_JSON:
            return read_limited(path, len(want)) == want
        got = json.loads(read_limited(path, 2 * len(want) + 4096))
        doc = json.loads(expected)
    except (OSError, UnsafeFileError, ValueError, RecursionError):
        return False
    if not isinstance(got, dict):
        return False
    got.pop("written", None)
    doc.pop("written", None)
    return got == doc


def refresh_run_reports(folder: Path) -> list[str]:
    """Write stale summary.md / junit.xml / summary.json again (``plan_run_reports``); returns the
    names written."""
    plan = plan_run_reports(folder)
    if plan is None:
        return []
    written: list[str] = []
    plan.write(written)
    return [n for n in written if n != "manifest.json"]


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
        err.print(f"report: {path_text(info['report'])}", soft_wrap=True)
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
            err_console().print(f"report: {path_text(info['report'])}", soft_wrap=True)
        except (ArtifactError, OSError) as e:
            err_console().print(f"[yellow]report not refreshed:[/] {plain_text(e)}")
    return code


def register(app: typer.Typer) -> None:
    app.command("report")(report)
