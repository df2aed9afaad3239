"""``nsa-run oneshot``: every registered stage, in order, into a new run folder."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from nsa_runner._ui import fail, shown
from nsa_runner.commands import _common as c
from nsa_runner.commands import report as report_cmd
from nsa_runner.manifest import RunManifest
from nsa_runner.registry import discover


def _names(text: str | None, flag: str, known: list[str]) -> list[str]:
    if text is None:
        return []
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        fail(f"{flag} needs a comma-separated list of stage names", f"known stages: {', '.join(known)}")
    unknown = [n for n in names if n not in known]
    if unknown:
        fail(f"{flag}: unknown stage {', '.join(shown(n) for n in unknown[:5])}"
             + (f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else ""),
             f"known stages: {', '.join(known)} (see `nsa-run list`)")
    return names


def _impls(text: str | None) -> str | None:
    """``--impl a,b`` checked against the registered implementations' names (nothing imported)."""
    if text is None:
        return None
    from nsa_runner.impls.discovery import parse_names

    try:
        return ",".join(parse_names(text))
    except ValueError as e:
        fail(f"--impl: {e}")


def _with_impl(entry, options: dict, impls: str | None) -> dict:
    """Hand ``--impl`` to every stage that takes implementations under test (the parity and bench
    stages, decode-bench included: their ``--impl`` defaults to the built-in ``nsa_core``; decode-bench's
    decode kernel is its own ``--kernel``, left alone)."""
    from nsa_runner.impls import BUILTIN

    if impls is not None and any(o.flag == "--impl" and o.default == BUILTIN for o in entry.options):
        options["impl"] = impls
    return options


def oneshot(
    out: Path = c.OUT,
    only: str = typer.Option(None, "--only", help="Run only these stages (comma-separated)."),
    skip: str = typer.Option(None, "--skip", help="Do not run these stages (comma-separated)."),
    profile: str = c.PROFILE,
    device: str = c.DEVICE,
    strict: bool = c.STRICT,
    timeout: float = c.TIMEOUT,
    as_json: bool = c.JSON,
    baseline: Path = report_cmd.BASELINE,
    impl: str = typer.Option(None, "--impl", help="Implementations under test, comma-separated (default "
                             "nsa_core): the parity stages run their cases against each (see `nsa-run list --impls`)."),
) -> None:
    """Run every registered stage in order (built-ins and plugins) on this machine."""
    machine, profile = c.resolve_machine(device, profile, timeout)
    impls = _impls(impl)
    base = report_cmd.load_baseline(baseline)
    entries = discover()
    known = [e.name for e in entries]
    selected = set(_names(only, "--only", known) or known) - set(_names(skip, "--skip", known))
    plan = [(e, _with_impl(e, c.default_options(e), impls)) for e in entries if e.name in selected]
    if not plan:
        fail("nothing to run: --only/--skip leave no stage", f"known stages: {', '.join(known)}")
    out = c.check_out(out)
    rid = c.current_run_id()
    c.check_earlier_runs(out, rid)
    # the folder appears with its manifest in it: any number of oneshots may start at once
    manifest = c.new_manifest(lambda: RunManifest.new(out, rid, sys.argv, device=machine.device, profile=profile,
                                                      strict=strict, selection={"only": only, "skip": skip},
                                                      command="oneshot"))
    folder = manifest.dir
    # report.html (+ the baseline check) once the stages are done; the run's own code is kept
    c.run_and_report(plan, manifest, machine, profile, timeout, strict, as_json,
                     after=lambda code: report_cmd.finish_oneshot(folder, code, base))


def register(app: typer.Typer) -> None:
    app.command("oneshot")(oneshot)
