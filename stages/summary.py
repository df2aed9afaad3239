"""Stage ``summary``: summary.md, summary.json and junit.xml over the stages recorded in the
run's manifest.json before it (the executor writes the manifest after every stage, so this
stage sees every earlier stage of the run; its own entry is added after it finishes).

junit.xml has one testcase per stage: FAIL -> <failure>, ERROR / TIMEOUT -> <error>,
SKIP -> <skipped> with the reason (never a pass). The stage itself PASSes when it wrote the
three reports; it SKIPs when no stage ran before it, and FAILs when the manifest is unusable.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from nsa_runner.artifacts import ManifestError, load_manifest, now_iso, write_json, write_text
from nsa_runner.stage import Stage, StageResult, Status

SUMMARY_SCHEMA_VERSION = 1
_ICON = {"PASS": "✅", "FAIL": "❌", "ERROR": "💥", "TIMEOUT": "⏱", "SKIP": "⏭"}


def counts(stages: list[dict]) -> dict[str, int]:
    c = {"passed": 0, "failed": 0, "skipped": 0}
    for s in stages:
        key = {"PASS": "passed", "SKIP": "skipped"}.get(s["status"], "failed")
        c[key] += 1
    return c


def _md_cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def markdown(m: dict, stages: list[dict], c: dict) -> str:
    host = m.get("host", {})
    lines = [
        f"# nsa-run summary — {m['run_id']}",
        "",
        f"- started {m.get('started')}, on {host.get('hostname', '?')} ({host.get('platform', '?')})",
        f"- device `{m.get('device', '?')}`, profile `{m.get('profile', '?')}`",
        f"- command: `{' '.join(m.get('argv', []))}`",
        "",
        "| # | stage | status | time | reason | files |",
        "|---|-------|--------|------|--------|-------|",
    ]
    for s in stages:
        reason = s.get("reason", "")
        if s["status"] == "SKIP" and s.get("hint"):
            reason += f" (fix: {s['hint']})"
        files = ", ".join(f"[{f}]({f})" for f in s.get("files", []))
        log = f"[log]({s['log']})" if s.get("log") else ""
        lines.append(f"| {s.get('order', '')} | {s['name']} | {_ICON.get(s['status'], '')} {s['status']} | "
                     f"{s.get('duration_s', 0):.1f}s | {_md_cell(reason)} | {', '.join(filter(None, [files, log]))} |")
    lines += ["", f"**{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped**", ""]
    broken = [s for s in stages if s["status"] in ("FAIL", "ERROR", "TIMEOUT")]
    for s in broken:
        detail = s.get("traceback") or s.get("log_tail") or ""
        if detail:
            lines += [f"## {s['name']}: {s['status']}", "", "```", detail.rstrip()[-4000:], "```", ""]
    return "\n".join(lines)


def _junit(m: dict, stages: list[dict], c: dict) -> str:
    total = sum(float(s.get("duration_s", 0)) for s in stages)
    errors = sum(s["status"] in ("ERROR", "TIMEOUT") for s in stages)
    failures = sum(s["status"] == "FAIL" for s in stages)
    suites = ET.Element("testsuites", name="nsa-run", tests=str(len(stages)), failures=str(failures),
                        errors=str(errors), skipped=str(c["skipped"]), time=f"{total:.3f}")
    suite = ET.SubElement(suites, "testsuite", name=f"nsa-run {m['run_id']}", tests=str(len(stages)),
                          failures=str(failures), errors=str(errors), skipped=str(c["skipped"]),
                          time=f"{total:.3f}", timestamp=str(m.get("started", "")),
                          hostname=str(m.get("host", {}).get("hostname", "")))
    for s in stages:
        case = ET.SubElement(suite, "testcase", classname="nsa-run", name=s["name"],
                             time=f"{float(s.get('duration_s', 0)):.3f}")
        reason = s.get("reason", "")
        if s["status"] == "FAIL":
            el = ET.SubElement(case, "failure", message=reason, type="FAIL")
            el.text = s.get("log_tail") or reason
        elif s["status"] in ("ERROR", "TIMEOUT"):
            el = ET.SubElement(case, "error", message=reason, type=s["status"])
            el.text = s.get("traceback") or s.get("log_tail") or reason
        elif s["status"] == "SKIP":
            ET.SubElement(case, "skipped", message=reason + (f" (fix: {s['hint']})" if s.get("hint") else ""))
        if s.get("files"):
            out = ET.SubElement(case, "system-out")
            out.text = "files: " + ", ".join(s["files"])
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


class Summary(Stage):
    name = "summary"
    order = 70
    requires = ()
    description = "summary.md / summary.json / junit.xml over all stages of the run"
    timeout_s = 120.0

    def run(self, ctx) -> StageResult:
        try:
            m = load_manifest(ctx.dir / "manifest.json")
        except ManifestError as e:
            return StageResult(Status.FAIL, f"cannot summarise: {e}")
        stages = [s for s in m["stages"] if s["name"] != self.name]
        c = counts(stages)
        summary = {"schema_version": SUMMARY_SCHEMA_VERSION, "run_id": m["run_id"], "written": now_iso(),
                   "started": m.get("started"), "device": m.get("device"), "profile": m.get("profile"),
                   "host": m.get("host"), "counts": c,
                   "stages": [{k: s.get(k) for k in ("name", "order", "status", "duration_s", "reason", "hint",
                                                     "files", "log", "metrics")} for s in stages]}
        write_json(ctx.dir / "summary.json", summary)
        write_text(ctx.dir / "summary.md", markdown(m, stages, c))
        write_text(ctx.dir / "junit.xml", _junit(m, stages, c))
        files = ["summary.md", "summary.json", "junit.xml"]
        line = f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped"
        print(f"summary of {len(stages)} stage(s): {line}")
        if not stages:
            return StageResult(Status.SKIP, "no stage ran before summary: nothing to summarise (reports are empty)",
                               files=files, hint="run it after other stages, e.g. nsa-run oneshot")
        return StageResult(Status.PASS, f"reports over {len(stages)} stage(s): {line}", files=files, metrics=c)
