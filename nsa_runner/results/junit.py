"""junit.xml of a run (built with ``junitparser``), valid against the common JUnit schema
(Jenkins' junit-10.xsd: no ``skipped`` attribute on ``<testsuites>``).

Layout: one ``<testsuite>`` per stage, named after it, with the stage's status, reason and files
as properties. A stage that declared a case table (a CSV with ``case`` and ``status`` columns,
e.g. triton_fwd.csv) gets one ``<testcase>`` per named case; any other stage gets one testcase
named after the stage. A failed stage whose cases all hold (its failure is stage-level) also
gets that stage testcase, so a failing stage always shows as a failing suite: the suites give
the same passed / failed / skipped as the CLI's closing line (``results.counts``). A SKIPped
stage's cases were not run: each is ``<skipped>`` whatever its table says (a skip is never a pass).
No two testcases share a classname + name (``unique_ids``): CI tools key tests by them.

The suites are filled with ``append`` and counted once (junitparser's ``add_testcase`` recounts the
whole suite on every add: quadratic in a case table's rows), and put in the document with ``append``
too (its ``add_testsuite`` compares each suite with every earlier one: quadratic in the stages).

Text from logs is sanitised: ANSI escapes, characters XML 1.0 cannot carry and bidi controls are removed.
"""

from __future__ import annotations

import csv
import io
import re
from collections import Counter
from pathlib import Path

from junitparser import Error, Failure, JUnitXml, Properties, Property, Skipped, TestCase, TestSuite

from nsa_runner._text import CONTROL
from nsa_runner.artifacts import UnsafeFileError, outside_problem, read_text_limited
from nsa_runner.results import CASE_COLUMNS, FAILED, case_status

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_TEXT_MAX = 8000
_NAME_EXTRA = ("branch", "path", "dtype", "impl")  # what tells apart rows that share a case id


def xml_chars(text: object) -> str:
    """``text`` as every file of the run shows it: without what the terminal drops (``_text.CONTROL``: escape
    sequences with their bodies, C0 / C1 controls, DEL, the bidi controls; one rule for the terminal,
    junit.xml, summary.md and report.html: round 17 B-1 found C1 CSI and DEL kept in the files) and without
    the characters XML 1.0 cannot carry (lone surrogates included)."""
    return _NOT_XML.sub("", CONTROL.sub("", "" if text is None else str(text)))


def clean(text: object, limit: int = _TEXT_MAX) -> str:
    """``text`` as junit.xml and summary.md show it (``xml_chars``), at most ``limit`` chars (the tail)."""
    return xml_chars(text)[-limit:]


def read_case_table(folder: Path, name: str) -> tuple[list[dict[str, str]] | None, str | None]:
    """(rows, problem) of one declared CSV read as a case table.

    ``rows`` is None when the file is not a case table (no ``case`` and ``status`` columns) or cannot
    be read (``report`` / ``compare`` validate and name those); ``problem`` is one line naming the
    file and the first row whose number of fields is not the header's (a short row gave the CSV
    reader's None as a case name, and junit.xml ended in a TypeError for this run and every later
    one): such a table gives no testcases, and the problem is said instead."""
    if outside_problem(folder, name) is not None:  # a hand-edited entry leading out: never read
        return None, None
    try:  # refused by type and size before reading (a FIFO or /dev/zero never hangs the report)
        text = read_text_limited(folder / name)
        # a byte-order mark before the header (pandas' ``to_csv(encoding="utf-8-sig")``): the first column is
        # still ``case`` (round 18 B U-a: such a table gave no testcases, its FAIL rows unseen under a PASS)
        lines = list(csv.reader(io.StringIO(text.removeprefix("\ufeff"), newline="")))
    except (OSError, UnicodeDecodeError, UnsafeFileError, csv.Error):
        return None, None
    if not lines or any(c not in lines[0] for c in CASE_COLUMNS):
        return None, None
    header = lines[0]
    for i, fields in enumerate(lines[1:], 2):
        if fields and len(fields) != len(header):
            return None, (f"case table {clean(name, 200)} line {i} has {len(fields)} field(s), the header "
                          f"{len(header)}: not read, no testcases from it (repair the stage's CSV)")
    return [dict(zip(header, fields, strict=True)) for fields in lines[1:] if fields], None


def case_rows(folder: Path, stage: dict, problems: list[str] | None = None) -> list[tuple[str, str, str]]:
    """(case name, status, note) of every named case in the CSVs the stage declared.

    A CSV counts as a case table when it has ``case`` and ``status`` columns; a status written another
    way (``fail``, ``FAILED``: ``results.case_status``) is that status, the spelling noted; any other word
    (e.g. ``N/A``: not applicable here) becomes SKIP with that word as note.
    Unreadable CSVs are ignored here (``report`` / ``compare`` validate and name them); a case
    table with a row of the wrong length is left out, its problem appended to ``problems``.
    """
    rows: list[tuple[str, str, str]] = []
    tables = [str(f) for f in stage.get("files") or [] if str(f).endswith(".csv")]
    for name in tables:
        data, problem = read_case_table(folder, name)
        if problem is not None and problems is not None:
            problems.append(problem)
        if not data:
            continue
        prefix = f"{Path(name).stem}: " if len(tables) > 1 else ""
        ids = Counter(r["case"] for r in data)  # counted once: ids.count per row was quadratic (round 12 B3)
        for r in data:
            case = r["case"]
            if ids[case] > 1:
                extra = [f"{k}={r[k]}" for k in _NAME_EXTRA if r.get(k)]
                case = f"{case} [{' '.join(extra)}]" if extra else case
            st, note = r["status"], r.get("note") or r.get("reason") or ""
            if case_status(st) is None:
                st, note = "SKIP", f"status {st}" + (f": {note}" if note else "")
            elif st != case_status(st):  # written another way (``fail``): that status, the spelling noted
                st, note = case_status(st), f"status written {st!r}" + (f": {note}" if note else "")
            rows.append((prefix + case, st, note))
    return rows


def case_table_problems(m: dict, folder: Path) -> list[str]:
    """One line per declared case table of manifest ``m`` that junit.xml could not use (``read_case_table``),
    each naming the stage, the file and the row: the CLI prints them after writing junit.xml."""
    out: list[str] = []
    for s in m["stages"]:
        problems: list[str] = []
        case_rows(folder, s, problems)
        out += [f"stage {clean(s['name'], 200)}: {p}" for p in problems]
    return out


def _result(status: str, message: str, detail: str):
    if status == "FAIL":
        r = Failure(clean(message, 2000), "FAIL")
    elif status in ("ERROR", "TIMEOUT"):
        r = Error(clean(message, 2000), status)
    elif status == "SKIP":
        return Skipped(clean(message, 2000))
    else:
        return None
    r.text = clean(detail or message)
    return r


def _id_key(classname: str, name: str) -> tuple[str, str]:
    """How CI tools tell testcases apart: classname + name, whitespace collapsed and stripped (some
    strip names: ``c2`` and ``c2 `` were merged)."""
    return " ".join(classname.split()), " ".join(name.split())


def unique_ids(ids: list[tuple[str, str]]) -> list[str]:
    """Names for testcases ``ids`` ((classname, name), cleaned, in document order) such that no two
    share a classname + name (``_id_key``), unique by construction: a name no other testcase has is
    kept as it is; of those that share one, the first keeps it and each later one gets `` (#N)``, N
    the first number giving a name that no testcase has (kept ones reserved first, so a case whose
    text is literally another's generated name cannot take it). Stable for unchanged input. A case
    text may be anything: the `` [dtype=… impl=…]`` suffix of ``case_rows`` could equal another
    row's literal case name, and a FAIL shared its id with a PASS (round 16 B B7)."""
    keys = [_id_key(c, n) for c, n in ids]
    taken = set(keys)
    seen: set[tuple[str, str]] = set()
    nxt: dict[tuple[str, str], int] = {}
    out = []
    for (_, name), key in zip(ids, keys, strict=True):
        if key not in seen:
            seen.add(key)
            out.append(name)
            continue
        n = nxt.get(key, 2)
        while (key[0], f"{key[1]} (#{n})") in taken:
            n += 1
        nxt[key] = n + 1
        taken.add((key[0], f"{key[1]} (#{n})"))
        out.append(f"{name.strip()} (#{n})")
    return out


def junit_xml(m: dict, folder: Path) -> str:
    """The junit.xml text for manifest ``m`` of run folder ``folder``."""
    xml = JUnitXml(clean(f"nsa-run {m['run_id']}"))
    host = str((m.get("host") or {}).get("hostname", ""))
    suites: list[tuple[TestSuite, list[TestCase], float]] = []
    for s in m["stages"]:
        status, reason = s["status"], s.get("reason", "")
        if status == "SKIP" and s.get("hint"):
            reason += f" (fix: {s['hint']})"
        suite = TestSuite(clean(s["name"]))
        suite.timestamp = clean(s.get("started") or m.get("started") or "")
        suite.hostname = clean(host)
        props = Properties()
        for k, v in (("status", status), ("reason", reason), ("order", s.get("order")), ("source", s.get("source")),
                     ("files", ", ".join(s.get("files") or [])), ("log", s.get("log"))):
            if v not in (None, ""):
                props.add_property(Property(k, clean(v, 2000)))
        problems: list[str] = []
        cases = case_rows(folder, s, problems)
        for p in problems:
            props.add_property(Property("problem", clean(p, 2000)))
        suite.append(props)
        # a hand-edited stage name with a control character, U+FFFE or a lone surrogate made junit.xml
        # not well-formed (ExpatError when pretty-printed): every name written goes through clean()
        classname = clean(f"nsa-run.{s['name']}")
        detail = "\n".join(filter(None, [s.get("traceback"), s.get("log_tail") and
                                          f"--- last lines of {s.get('log') or 'the log'} ---\n{s['log_tail']}"]))
        if status == "SKIP":  # a skipped stage's cases were not run here: each one is skipped (round 12 B6)
            cases = [(case, "SKIP", f"stage skipped: {reason or 'SKIP'}; its case table says {st}"
                      + (f": {note}" if note else "")) for case, st, note in cases]
        # suite.append, not add_testcase: junitparser recounts every case of the suite on each
        # add_testcase (quadratic: 60 000 rows took more than 10 min, round 12 B3); counted once below
        tcs = []
        for case, st, note in cases:
            tc = TestCase(clean(case), classname, 0.0)
            res = _result(st, note or f"{case}: {st}", "")
            if res is not None:
                tc.result = [res]
            tcs.append(tc)
        if not cases or (status in FAILED and not any(st in FAILED for _, st, _ in cases)):
            tc = TestCase(clean(s["name"]), classname, float(s.get("duration_s") or 0))
            res = _result(status, reason or status, detail)
            if res is not None:
                tc.result = [res]
            if s.get("files"):
                tc.system_out = clean("files: " + ", ".join(s["files"]))
            tcs.append(tc)
        suites.append((suite, tcs, round(float(s.get("duration_s") or 0), 3)))
    # testcase ids unique over the document (a case named like another's generated id, like its
    # stage, or two stage entries of one cleaned name), before any is appended
    every = [tc for _, tcs, _ in suites for tc in tcs]
    for tc, name in zip(every, unique_ids([(tc.classname, tc.name) for tc in every]), strict=True):
        tc.name = name
    for suite, tcs, seconds in suites:
        for tc in tcs:
            suite.append(tc)
        suite.update_statistics()
        suite.time = seconds
        # xml.append, not add_testsuite: junitparser compares each new suite with every earlier one
        # (to merge equal ones): quadratic in the stages, 8 000 stages took 118 s (round 14 B R10); one
        # suite per manifest entry, as the closing counts line counts them
        xml.append(suite)
    xml.update_statistics()
    xml._elem.attrib.pop("skipped", None)  # not in the JUnit schema for <testsuites>
    buf = io.BytesIO()
    xml.write(buf, pretty=True)
    return buf.getvalue().decode("utf-8")


def suite_status(suite_el) -> str:
    """PASS / FAIL / SKIP of one ``<testsuite>`` element as a CI system reads it (used by tests)."""
    if int(suite_el.get("failures", 0)) or int(suite_el.get("errors", 0)):
        return "FAIL"
    tests, skipped = int(suite_el.get("tests", 0)), int(suite_el.get("skipped", 0))
    return "SKIP" if tests and skipped == tests else "PASS"
