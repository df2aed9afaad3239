"""``nsa-run stage NAME [stage options]``: one stage into this code's run folder.

The run folder is the latest ``<out>/<run-id>[.N]/`` (created when there is none). When the
stage already has a result there, its files and log move to ``history/<stage>-<time>/`` and,
once the new result is recorded, its manifest entry to the manifest's ``history``; a rerun that
is interrupted or whose runner dies puts the earlier result back. Nothing is deleted.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from nsa_runner._ui import err_console, fail, out_console, path_text, shown
from nsa_runner.commands import _common as c
from nsa_runner.commands import report as report_cmd
from nsa_runner.registry import discover


def stage(
    ctx: typer.Context,
    name: str = typer.Argument(None, help="Stage name (see `nsa-run list`)."),
    out: Path = c.OUT,
    profile: str = c.PROFILE,
    device: str = c.DEVICE,
    strict: bool = c.STRICT,
    timeout: float = c.TIMEOUT,
    as_json: bool = c.JSON,
    show_help: bool = typer.Option(False, "--help", help="Show this message (with NAME: and the stage's own "
                                   "options) and exit."),
) -> None:
    """Run one stage. Stage options follow the name, e.g. `nsa-run stage decode-bench --S-list 1k,2k`;
    `nsa-run stage NAME --help` lists that stage's own options."""
    if show_help:
        _help(ctx, name, device)
    if name is None:
        fail("nsa-run stage needs a stage NAME", "see `nsa-run list` for the stages here; "
             "`nsa-run stage NAME --help` for a stage's options")
    machine, profile = c.resolve_machine(device, profile, timeout)
    entries = {e.name: e for e in discover()}
    if name not in entries:
        fail(f"unknown stage {shown(name)}", f"known stages: {', '.join(entries) or 'none'} (see `nsa-run list`)")
    entry = entries[name]
    options = c.parse_stage_options(entry, list(ctx.args))
    out = c.check_out(out)
    rid = c.current_run_id()
    manifest = c.open_latest_run(out, rid, sys.argv, device=machine.device, profile=profile, strict=strict,
                                 command="stage")

    def run(stopped: bool = False) -> None:
        c.run_and_report([(entry, options)], manifest, machine, profile, timeout, strict, as_json,
                         after=lambda code: report_cmd.refresh_report(manifest.dir, code), stopped=stopped)

    # from the set-aside on, an interrupt puts the earlier result back and is recorded as the run's (round 20 A
    # A20-R1: one before the run began left it in history/, the folder reading "runner died")
    with c.interrupt_puts_back(run):
        moved = c.set_aside(manifest, name)
        if moved is not None:
            err_console().print(f"earlier {name} result set aside in {path_text(moved)} (put back if this run does "
                                "not finish)")
        run()


def _help(ctx: typer.Context, name: str | None, device: str | None) -> None:
    """The command's help, then (with NAME) the stage's description and its own options."""
    from nsa_runner.commands.list_stages import _render_one, _row

    out_console().print(ctx.get_help())
    if name is None:
        raise typer.Exit(0)
    machine, _ = c.resolve_machine(device, None, None)  # first: it refuses metadata discovery would hang on
    entries = {e.name: e for e in discover()}
    if name not in entries:
        fail(f"unknown stage {shown(name)}", f"known stages: {', '.join(entries) or 'none'} (see `nsa-run list`)")
    _render_one(_row(entries[name], machine))
    raise typer.Exit(0)


def register(app: typer.Typer) -> None:
    # --help is this command's own option: with a NAME it also lists that stage's options
    app.command("stage", add_help_option=False,
                context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(stage)
