"""``nsa-run list``: stages known here (built-in and plugins), order, requirements, options,
where each comes from, and whether it can run on this machine (and why not).

``nsa-run list --impls``: the implementations under test instead (entry-point group
``nsa_runner.impls``, loaded in a child process): the parts each provides, its constraints, where
its semantics differ, and whether it can run here (and why not).

Exit 1 when a plugin (stage or implementation) is broken (it would fail ``oneshot``), else 0.
"""

from __future__ import annotations

import json

import typer
from rich.table import Table

from nsa_runner._ui import TABLE_REASON_CHARS, clip, fail, out_console, plain_text, shown
from nsa_runner.commands import _common as c
from nsa_runner.registry import Machine, StageEntry, discover, skip_reason, unmet

SOURCE_CHARS = 80  # the source column of the stages table (a plugin's Name / Version: clipped already)


def _row(e: StageEntry, machine: Machine) -> dict:
    if e.stage is None:
        runs, why = False, f"broken: {e.error}"
    elif unmet(e.stage, machine):
        reason, hint = skip_reason(e.stage, machine)
        runs, why = False, f"{reason}" + (f" (fix: {hint})" if hint else "")
    else:
        runs, why = True, ""
    return {
        "name": e.name,
        "order": e.order,
        "requires": list(e.requires),
        "source": e.source,
        "entry_point": e.value,
        "options": [{"flag": o.flag, "default": o.default, "help": o.help, "choices": list(o.choices)}
                    for o in e.options],
        "description": (e.stage.description if e.stage is not None else ""),
        "runs_here": runs,
        "why_not": why,
    }


def _t(text: object, one_line: bool = True) -> str:
    """A plugin-provided text as the terminal shows it: clipped like a reason in the run table
    ("… (N more characters)"), markup and control characters made plain; ``one_line`` folds its
    whitespace. Every plugin text `list`, `list NAME`, `list --impls` and `stage NAME --help` print
    goes through here (round 12 B4 clipped errors / why-not only; round 13 B6: a check docstring,
    differences, note, description, option help or a METADATA Version of megabytes was printed
    whole). --json keeps them whole."""
    text = str(text)
    return plain_text(clip(" ".join(text.split()) if one_line else text, TABLE_REASON_CHARS))


def _source_cell(text: str) -> str:
    """A row's source in the stages table: at most ``SOURCE_CHARS`` characters, what is left out named on
    a line of its own (round 14 R1: a plugin's long Name / Version took the table's width)."""
    text = " ".join(str(text).split())
    if len(text) <= SOURCE_CHARS:
        return plain_text(text)
    return plain_text(text[:SOURCE_CHARS]) + f"…\n({len(text) - SOURCE_CHARS} more characters)"


def _why(r: dict) -> str:
    """A row's why-not for the terminal: clipped like a reason in the run table (round 12 B4: a broken
    plugin's 100 000-line import error made `nsa-run list` print 15 MB; --json keeps it whole)."""
    return _t(r["why_not"])


def _json(doc: dict) -> str:
    """``doc`` as strict JSON (round 13 B10: NaN / Infinity from a plugin made --json not JSON)."""
    from nsa_runner.impls.discovery import plain_json

    return json.dumps(plain_json(doc), indent=2, allow_nan=False)


def _render_one(r: dict) -> None:
    con = out_console()
    con.print(f"[bold]{_t(r['name'])}[/] (order {r['order']}, {_t(r['source'])}, "
              f"{_t(r['entry_point'])})")
    if r["description"]:
        con.print(_t(r["description"], one_line=False))
    con.print(f"requires: {_t(', '.join(r['requires'])) or '-'}   runs here: "
              + ("yes" if r["runs_here"] else f"no: {_why(r)}"))
    if not r["options"]:
        con.print("options: none")
        return
    t = Table(title=f"options of `nsa-run stage {_t(r['name'])}`")
    for col in ("flag", "default", "choices", "help"):
        t.add_column(col, overflow="fold", no_wrap=col == "flag")
    for o in r["options"]:
        default = "(chosen by the stage)" if o["default"] is None else str(o["default"])
        t.add_row(_t(o["flag"]), _t(default), _t(", ".join(map(str, o["choices"]))) or "-",
                  _t(o["help"] or ""))
    con.print(t)


def list_stages(
    name: str = typer.Argument(None, help="Show one stage in detail: description and its options."),
    device: str = c.DEVICE,
    as_json: bool = c.JSON,
    impls: bool = typer.Option(False, "--impls", help="List the implementations under test (--impl) instead: "
                               "their parts, constraints and whether each can run here."),
) -> None:
    """List the registered stages and whether each can run on this machine (NAME: one stage's options)."""
    machine, _ = c.resolve_machine(device, None, None)
    if impls:
        if name is not None:
            fail("nsa-run list --impls takes no stage NAME")
        _list_impls(machine.device, as_json)
    rows = [_row(e, machine) for e in discover()]
    broken = [r["name"] for r in rows if r["why_not"].startswith("broken:")]
    if name is not None:
        match = [r for r in rows if r["name"] == name]
        if not match:
            fail(f"unknown stage {shown(name)}", f"known stages: {', '.join(r['name'] for r in rows) or 'none'}")
        if as_json:
            print(_json({"schema_version": 1, "device": machine.device, "stage": match[0]}))
        else:
            _render_one(match[0])
        raise typer.Exit(1 if name in broken else 0)
    if as_json:
        print(_json({"schema_version": 1, "device": machine.device, "stages": rows}))
    else:
        t = Table(title=f"nsa-run stages (device={machine.device})")
        for col in ("order", "stage", "requires", "source", "options", "runs here"):
            t.add_column(col, overflow="fold", no_wrap=col in ("order", "stage"))
        for r in rows:
            runs = "[green]yes[/]" if r["runs_here"] else f"[red]no[/]: {_why(r)}"
            t.add_row("-" if r["order"] is None else str(r["order"]), _t(r["name"]),
                      _t(", ".join(r["requires"])) or "-", _source_cell(r["source"]),
                      _t(" ".join(o["flag"] for o in r["options"])) or "-", runs)
        out_console().print(t)
    raise typer.Exit(1 if broken else 0)


def _list_impls(device: str, as_json: bool) -> None:
    from nsa_runner.impls.discovery import describe_all
    from nsa_runner.registry import TempFolderFull, temp_full_exit

    try:
        rows = describe_all(device)
    except TempFolderFull as e:  # the impl plugins' discovery: a full TMPDIR is said as it is (round 13 A-B3)
        temp_full_exit(e)
    broken = [r["name"] for r in rows if r["broken"]]
    if as_json:
        print(_json({"schema_version": 1, "device": device, "impls": rows}))
    else:
        t = Table(title=f"nsa-run implementations under test (device={device}; use with --impl)")
        for col in ("impl", "source", "parts", "constraints", "runs here"):
            t.add_column(col, overflow="fold", no_wrap=col == "impl")
        for r in rows:
            cons = r["constraints"] or {}
            text = ", ".join(filter(None, [
                f"dtypes {'/'.join(cons['dtypes'])}" if cons.get("dtypes") else "",
                f"head dim <= {cons['max_head_dim']}" if cons.get("max_head_dim") else "",
                f"heads/group {cons['heads_per_group']}" if cons.get("heads_per_group", "any") != "any" else "",
                "needs CUDA" if cons.get("needs_cuda") else "", str(cons.get("more") or "")]))
            diffs = "; ".join(f"{p}: {d}" for p, d in (r.get("differences") or {}).items())
            runs = "[green]yes[/]" if r["runs_here"] else f"[red]no[/]: {_why(r)}"
            if r.get("note"):
                runs += f" ({_t(r['note'])})"
            t.add_row(_t(r["name"]), _t(r["source"]), _t(", ".join(r["parts"])) or "-",
                      (_t(text) + (f" | differs: {_t(diffs)}" if diffs else "")) or "-", runs)
        out_console().print(t)
    raise typer.Exit(1 if broken else 0)


def register(app: typer.Typer) -> None:
    app.command("list")(list_stages)
