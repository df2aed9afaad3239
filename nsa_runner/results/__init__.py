"""The results schema of a run, in one place: statuses, how stages are counted, and the run-level
reports built from the manifest (summary.md / summary.json in ``results.summary``, junit.xml in
``results.junit``).

Everything that counts stages — the CLI's closing line, summary.md, summary.json, junit.xml,
report.html, ``compare`` — calls :func:`counts` here, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

STATUSES = ("PASS", "FAIL", "SKIP", "ERROR", "TIMEOUT")
FAILED = ("FAIL", "ERROR", "TIMEOUT")  # all three count as "failed"

SUMMARY_MD = "summary.md"
SUMMARY_JSON = "summary.json"
JUNIT_XML = "junit.xml"
REPORT_HTML = "report.html"
RUN_REPORTS = (SUMMARY_MD, SUMMARY_JSON, JUNIT_XML)


def status_of(stage: Any) -> str:
    """The status word of a manifest entry (dict) or a StageRecord."""
    if isinstance(stage, dict):
        return str(stage["status"])
    st = stage.status
    return str(getattr(st, "value", st))


def counts(stages: Iterable[Any]) -> dict[str, int]:
    """``{"passed", "failed", "skipped"}`` over stages (manifest dicts or StageRecords).

    PASS -> passed, SKIP -> skipped (never a pass), FAIL / ERROR / TIMEOUT (or anything else) -> failed.
    """
    c = {"passed": 0, "failed": 0, "skipped": 0}
    for s in stages:
        c[{"PASS": "passed", "SKIP": "skipped"}.get(status_of(s), "failed")] += 1
    return c


def counts_line(c: dict[str, int]) -> str:
    """``N passed, N failed, N skipped`` — the last line of every run."""
    return f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped"
