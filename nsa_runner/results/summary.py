"""summary.md and summary.json of a run, rendered from its manifest (all stages recorded so far).

The runner writes them at the end of every ``oneshot`` / ``stage`` call (also when interrupted
or when the ``summary`` stage was skipped), with the same counts as the CLI's closing line.
"""

from __future__ import annotations

import os
import re
import urllib.parse

from nsa_runner._text import clip, command_shown
from nsa_runner.artifacts import now_iso, planned_state, runner_died, set_aside_copy, unfinished
from nsa_runner.results import FAILED, counts, counts_line
from nsa_runner.results.junit import clean

SUMMARY_SCHEMA_VERSION = 1
_ICON = {"PASS": "✅", "FAIL": "❌", "ERROR": "💥", "TIMEOUT": "⏱", "SKIP": "⏭"}


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~&])")


def md_cell(text: object) -> str:
    """Plain text for one markdown line / table cell: control characters and ANSI escapes removed,
    whitespace (newlines) collapsed, every markdown / HTML metacharacter backslash-escaped — a
    stage's text can neither break the table nor become a link, image, code span or HTML."""
    return _MD_SPECIAL.sub(r"\\\1", " ".join(clean(text).split()))


def _md_link(name: str) -> str:
    """A link to a file of the run folder: escaped text, a relative, percent-encoded target."""
    # the target is the file's own name, percent-encoded whole (an escape sequence or a bidi control in it
    # kept: the link leads to that file, never to another whose name is the cleaned text: round 17 B-3);
    # only the text shown loses them
    target = link_target(name)
    return f"[{md_cell(name)}]({target})" if target is not None else md_cell(name)


def _recorded_md_link(m: dict, stage: str, name: object, text: str | None = None) -> str:
    """A link to what the manifest records for a stage's file (its log: ``text`` "log"): while a rerun has the
    stage's files set aside in history/, their set-aside copy (``artifacts.set_aside_copy``; round 34 B34-5)."""
    aside = set_aside_copy(m, stage, str(name))
    shown, path = (text or str(name)), str(name)
    if aside == "":
        return md_cell(f"{shown} (not in this run while its stage is rerun)")
    if aside is not None:
        shown, path = f"{shown} (set aside)", aside
    target = link_target(path)
    return f"[{md_cell(shown)}]({target})" if target is not None else md_cell(f"{shown} {path}")


def link_target(name: object) -> str | None:
    """The relative URL of a run folder's file ``name``: ``./`` + the name percent-encoded as the bytes the
    file system holds (a lone surrogate: as Python wrote it); None (shown as text, never linked) for a name
    that does not stay in the run folder: absolute, ``..``, empty (round 17 A U-e: a hand-edited
    ``//evil.example/x`` was a protocol-relative link out of report.html, ``/etc/passwd`` a link to it).
    summary.md and report.html link through it."""
    name = str(name)
    parts = name.replace("\\", "/").split("/")
    if not name or name.startswith(("/", "\\")) or ".." in parts:
        return None
    try:
        raw = os.fsencode(name)
    except UnicodeError:
        raw = name.encode("utf-8", "surrogatepass")
    return "./" + urllib.parse.quote(raw)


def _md_code_block(text: str) -> list[str]:
    """A fenced block that no run of backticks inside ``text`` can close."""
    body = clean(text).rstrip()
    longest = max((len(m) for m in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, body, fence]


LATER_SHOWN = 20  # later commands into one run folder named in summary.md / report.html, at most (the newest)


def later_commands(m: dict) -> list[str]:
    """Each later command into the run folder (manifest.json's ``updates``), as its command line (clipped), its
    started time after it; past ``LATER_SHOWN``, the newest (they made the records shown), after one line saying
    how many earlier ones manifest.json records (round 40 U40-2: the first 20 were shown, the newest hidden)."""
    ups = [u for u in (m.get("updates") or []) if isinstance(u, dict)] if isinstance(m.get("updates"), list) else []
    out = [f"... {len(ups) - LATER_SHOWN} earlier (manifest.json's updates)"] if len(ups) > LATER_SHOWN else []
    return out + [f"{clip(command_shown(u.get('argv')), 1000)} (started {clip(str(u.get('started') or '?'), 40)})"
                  for u in ups[-LATER_SHOWN:]]


def markdown(m: dict, stages: list[dict] | None = None) -> str:
    """summary.md over ``stages`` (default: every stage in the manifest ``m``)."""
    stages = m["stages"] if stages is None else stages
    c = counts(stages)
    host = m.get("host", {})
    lines = [
        f"# nsa\\-run summary — {md_cell(m['run_id'])}",
        "",
        f"- started {md_cell(m.get('started'))}, on {md_cell(host.get('hostname', '?'))} "
        f"({md_cell(host.get('platform', '?'))})",
        f"- device {md_cell(m.get('device', '?'))}, profile {md_cell(m.get('profile', '?'))}",
        f"- command: {md_cell(command_shown(m.get('argv')))}",
    ]
    lines += [f"  - then: {md_cell(c)}" for c in later_commands(m)]  # round 39 U39-1: only the first was named
    if m.get("interrupted"):
        lines.append(f"- **interrupted** {md_cell(interrupted_line(m))}")
    died = unfinished(m)
    if died:
        lines.append(f"- **{md_cell(died)}**")
    lines += [
        "",
        "| # | stage | status | time | reason | files |",
        "|---|-------|--------|------|--------|-------|",
    ]
    for s in stages:
        reason = s.get("reason", "")
        if s["status"] == "SKIP" and s.get("hint"):
            reason += f" (fix: {s['hint']})"
        files = [_recorded_md_link(m, s["name"], f) for f in s.get("files", [])]
        if s.get("log"):
            files.append(_recorded_md_link(m, s["name"], s["log"], "log"))
        status = md_cell(s["status"])
        lines.append(f"| {md_cell(s.get('order', ''))} | {md_cell(s['name'])} | {_ICON.get(s['status'], '')} "
                     f"{status} | {float(s.get('duration_s') or 0):.1f}s | {md_cell(reason)} | {', '.join(files)} |")
    lines += ["", f"**{counts_line(c)}**", ""]
    for s in stages:
        detail = s.get("traceback") or s.get("log_tail") or ""
        if s["status"] in FAILED and detail:
            lines += [f"## {md_cell(s['name'])}: {md_cell(s['status'])}", "",
                      *_md_code_block(clean(detail).rstrip()[-4000:]), ""]
    return "\n".join(lines)


def interrupted_line(m: dict) -> str:
    """What an interrupted run lacks (``artifacts.planned_state``: the planned stages an interrupt stopped or that
    have no result, or that every one has its own). The ``interrupted`` flag is the run folder's: set by any command
    into it that was stopped, a rerun that was undone too (round 17 A U-c, round 18 A)."""
    state = planned_state(m)
    if state is None:
        return "(Ctrl-C / cancel): stages after the last one listed did not run"
    if not state.startswith("every"):
        return f"(Ctrl-C / cancel): {state}"
    return f"(Ctrl-C / cancel): an nsa-run command into this run was stopped; {state}"


def summary_json(m: dict, stages: list[dict] | None = None) -> dict:
    stages = m["stages"] if stages is None else stages
    return {"schema_version": SUMMARY_SCHEMA_VERSION, "run_id": m["run_id"], "written": now_iso(),
            "started": m.get("started"), "finished": m.get("finished"),
            "interrupted": bool(m.get("interrupted")), "runner_died": runner_died(m),
            "interrupted_line": interrupted_line(m) if m.get("interrupted") else None,
            "device": m.get("device"), "profile": m.get("profile"), "host": m.get("host"),
            "counts": counts(stages),
            "stages": [{k: s.get(k) for k in ("name", "order", "status", "duration_s", "reason", "hint",
                                              "files", "log", "metrics")} for s in stages]}
