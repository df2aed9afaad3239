"""The results schema of a run, in one place: statuses, file names, table columns, how stages are
counted, and the run-level reports built from the manifest (summary.md / summary.json in
``results.summary``, junit.xml in ``results.junit``). Readers (``nsa_runner._readers``), report,
compare, junit, the summary stage and the CLI all take them from here.

Everything that counts stages — the CLI's closing line, summary.md, summary.json, junit.xml,
report.html, ``compare`` — calls :func:`counts` here, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nsa_runner.stage import Status

# ---- statuses (the vocabulary of DESIGN §5: nsa_runner.stage.Status) ----------------------------
STATUSES = tuple(s.value for s in Status)  # PASS FAIL SKIP ERROR TIMEOUT
FAILED = tuple(s.value for s in Status if s.failed)  # all three count as "failed"

_SPELLINGS = {"PASSED": "PASS", "FAILED": "FAIL", "FAILURE": "FAIL", "SKIPPED": "SKIP", "ERRORED": "ERROR",
              "TIMED OUT": "TIMEOUT", "TIMEDOUT": "TIMEOUT"}


def case_status(word: object) -> str | None:
    """A case table row's status as one of ``STATUSES``: the word itself, or written another way (case, spaces
    around it, invisible controls and format characters, full-width letters, a past tense: ``fail``, ``FAILED``,
    `` PASS``; round 17 U-1: such a FAIL was a junit skip, green in CI); None for any other word (``N/A``: the row
    says it does not apply)."""
    import unicodedata

    from nsa_runner._text import CONTROL

    # compatibility forms folded (full-width ＦＡＩＬ), invisible format characters dropped (a zero-width space,
    # U+FEFF, a soft hyphen: round 18 A-R3, "FAIL\u200b" was a junit skip under a PASS)
    text = unicodedata.normalize("NFKC", CONTROL.sub("", str(word)))
    text = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")
    text = " ".join(text.split()).upper()
    text = _SPELLINGS.get(text, text)
    return text if text in STATUSES else None


# ---- run-level files written by the runner ---------------------------------------------------------
SUMMARY_MD = "summary.md"
SUMMARY_JSON = "summary.json"
JUNIT_XML = "junit.xml"
REPORT_HTML = "report.html"
RUN_REPORTS = (SUMMARY_MD, SUMMARY_JSON, JUNIT_XML)

# ---- stage tables (DESIGN §6). Report and compare find tables by what each stage DECLARED in the
# manifest (a plugin's show up too); these names are the built-ins' and the required columns. -----
# A case table: one row per named case (junit.xml gives each its own testcase).
CASE_COLUMNS = ("case", "status")
# A parity table (triton_fwd.csv, triton_bwd.csv, or any declared CSV with these columns).
PARITY_FILES = ("triton_fwd.csv", "triton_bwd.csv")
PARITY_REQUIRED = ("case", "B", "T", "HQ", "G", "dk", "dv", "dtype", "max_abs", "rel_err", "tol", "status")
PARITY_NUMERIC = ("B", "T", "HQ", "G", "dk", "dv", "max_abs", "rel_err", "tol")
# Timing tables: any declared CSV with a timing column; decode.csv needs its key columns.
DECODE_FILE = "decode.csv"
DECODE_REQUIRED = ("S", "B")
TIMING_FILES = (DECODE_FILE, "fa2_bench.csv", "prefill.csv")
KERNEL_BENCH_GLOBS = ("bench_*.csv", "kernel_bench*.csv")  # written by bench/ scripts, not declared


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
