"""Hostile text in a run folder cannot break or inject into report.html, summary.md or junit.xml.

Stage names, reasons, hints, log tails, tracebacks, declared file names and CSV key cells are
text a plugin (or a log) controls. Every one of them here carries ``<script>``, ``|``,
newlines, backticks (and a ``` fence), a ``javascript:`` link, ANSI colour escapes and control
characters. The reports are produced the public way (the ``summary`` stage over the manifest,
``nsa-run report`` for report.html) and read back with real parsers:

- report.html: ``html.parser`` — no element or attribute comes from the hostile text, no
  ``javascript:`` URL, no control character; the text itself is still shown (escaped, not lost);
- summary.md: rendered with markdown-it (CommonMark + tables, raw HTML on, every link allowed:
  the most permissive renderer) — one table row per stage with six cells, no injected element,
  no ``javascript:`` link, the log tail stays inside its code block;
- junit.xml: ``xml.etree`` must parse it (XML 1.0 has no ESC / BEL), the hostile text comes back
  as text, ANSI sequences are gone.
"""

from __future__ import annotations

import json
import re
import urllib.parse
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from types import SimpleNamespace

import pandas as pd
import pytest

try:
    from _runfolders import make_run
except ImportError:  # pragma: no cover - run from the repository root
    from tests._runfolders import make_run

from nsa_runner.artifacts import write_csv, write_json

BAD = ("<script>alert('pwn')</script> a|b `tick` ``` fence\n```\n# heading [click](javascript:alert(1)) "
       "<img src=x onerror=alert(2)> \x1b[31mRED\x1b[0m bell\x07 nul\x00 & done")
EVIL_NAME = "evil<script>x</script>|`n`\nname"
EVIL_FILE = "javascript:alert(3)"
CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# the elements the hostile text would create if it were not escaped
INJECTED = {"script", "img", "h1", "code"}


def _hostile_run(tmp_path):
    folder = make_run(tmp_path / "out", statuses={"triton-fwd": "FAIL", "fa2-probe": "SKIP", "decode-bench": "ERROR"})
    m = json.loads((folder / "manifest.json").read_text())
    (folder / EVIL_FILE).write_text("x")
    (folder / "logs").mkdir(exist_ok=True)
    for s in m["stages"]:
        if s["name"] == "triton-fwd":
            s.update(reason=BAD, log_tail=BAD)
        elif s["name"] == "fa2-probe":
            s.update(reason=BAD, hint=BAD)
        elif s["name"] == "decode-bench":
            s.update(reason=BAD, traceback="Traceback (most recent call last):\n" + BAD, files=[EVIL_FILE])
    m["stages"].insert(5, {"name": EVIL_NAME, "order": 55, "source": "plugin", "status": "FAIL", "duration_s": 0.5,
                           "reason": BAD, "hint": "", "files": [EVIL_FILE], "log": "logs/evil.log",
                           "log_tail": BAD})
    (folder / "logs" / "evil.log").write_text(BAD)
    m["stages"] = [s for s in m["stages"] if s["name"] != "summary"]
    write_json(folder / "manifest.json", m)
    # CSV key cells: the case id and the note of a parity row
    df = pd.read_csv(folder / "triton_fwd.csv", keep_default_na=False)
    df.loc[0, ["case", "note", "status"]] = [BAD, BAD, "FAIL"]
    write_csv(folder / "triton_fwd.csv", df)
    for f in ("summary.md", "summary.json", "junit.xml"):
        (folder / f).unlink()
    return folder, m


class _Html(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(k, v or "") for k, v in attrs]

    handle_startendtag = handle_starttag

    def handle_data(self, data):
        self.text.append(data)


def _parse_html(text: str) -> _Html:
    p = _Html()
    p.feed(text)
    p.close()
    return p


def _check_html(doc: str, baseline_tags: set[str]) -> _Html:
    assert not CONTROL.search(doc), repr(CONTROL.search(doc).group())
    p = _parse_html(doc)
    injected = (set(p.tags) & INJECTED) - baseline_tags
    assert not injected, f"elements injected by stage text: {injected}"
    for k, v in p.attrs:
        assert not k.startswith("on"), f"event handler attribute {k}={v!r}"
        assert not re.match(r"\s*(javascript|vbscript|data):", v, re.I) or v.startswith("data:image/png;base64,"), \
            f"{k}={v!r}"
    return p


@pytest.fixture
def hostile(tmp_path):
    return _hostile_run(tmp_path)


def _summary_stage(folder):
    from stages.summary import Summary

    ctx = SimpleNamespace(dir=folder, device="cuda", profile="full", options={}, run_id=folder.name, stage="summary")
    res = Summary().run(ctx)
    assert res.status.value in ("PASS", "SKIP"), res.reason


def test_report_html_escapes_every_text_field(hostile, cli):
    folder, m = hostile
    r = cli("report", folder)
    assert r.exit_code == 0, r.stdout + r.stderr
    doc = (folder / "report.html").read_text(encoding="utf-8")
    # the report's own elements: one <h1> title and the plots' <img>, always inline PNG data
    p = _check_html(doc, baseline_tags={"h1", "img"})
    assert p.tags.count("h1") == 1
    srcs = [v for k, v in p.attrs if k == "src"]
    assert len(srcs) == p.tags.count("img") and all(v.startswith("data:image/png;base64,") for v in srcs), \
        [v[:40] for v in srcs]
    text = "".join(p.text)
    # still shown, as text: the reason, the stage name, the CSV key cell
    assert "<script>alert('pwn')</script>" in text
    assert "evil<script>x</script>" in text
    assert text.count("<img src=x onerror=alert(2)>") >= 3
    hrefs = [v for k, v in p.attrs if k == "href"]
    assert any("alert(3)" in urllib.parse.unquote(h) for h in hrefs)  # the file is linked, as a relative path


def test_summary_md_escapes_every_text_field(hostile):
    mdit = pytest.importorskip("markdown_it", reason="markdown-it-py (a rich dependency) renders the markdown")
    folder, m = hostile
    _summary_stage(folder)
    md = (folder / "summary.md").read_text(encoding="utf-8")
    assert not CONTROL.search(md), repr(CONTROL.search(md).group())
    renderer = mdit.MarkdownIt("commonmark", {"html": True}).enable("table")
    renderer.validateLink = lambda url: True  # the most permissive viewer: every link is rendered
    # the summary's own <h1> title and code blocks are allowed; the table / heading checks below
    # prove stage text adds none
    p = _check_html(renderer.render(md), baseline_tags={"code", "h1"})
    tokens = renderer.parse(md)
    stages = m["stages"]
    rows = [t for t in tokens if t.type == "tr_open"]
    assert len(rows) == len(stages) + 1, "a stage's text broke the table (| or newline not escaped)"
    cells = [t for t in tokens if t.type in ("td_open", "th_open")]
    assert len(cells) == 6 * (len(stages) + 1)
    # inside the table, stage text is plain text: no code span, raw HTML, image or link from it
    # (the files column links the stage's files: relative targets only)
    in_table = [c for i, t in enumerate(tokens) if t.type == "td_open" for c in (tokens[i + 1].children or [])]
    kinds = {c.type for c in in_table}
    assert not kinds & {"code_inline", "html_inline", "image"}, kinds
    for c in in_table:
        if c.type == "link_open":
            assert not re.match(r"\s*[a-z][a-z0-9+.-]*:", c.attrs.get("href", ""), re.I), c.attrs
    assert [t.tag for t in tokens if t.type == "heading_open"].count("h1") == 1, \
        "stage text became a heading (a log tail escaped its code block?)"
    text = "".join(p.text)
    assert "<script>alert('pwn')</script>" in text and "evil<script>x</script>" in text


def _all_text(root) -> str:
    parts = []
    for el in root.iter():
        parts.append(el.text or "")
        parts.append(el.tail or "")
        parts += list(el.attrib.values())
    return "\n".join(parts)


def test_junit_xml_is_valid_and_keeps_hostile_text_as_text(hostile):
    folder, m = hostile
    _summary_stage(folder)
    raw = (folder / "junit.xml").read_bytes()
    root = ET.fromstring(raw)  # raises on anything XML 1.0 cannot carry
    assert not CONTROL.search(raw.decode("utf-8"))
    text = _all_text(root)
    assert "<script>alert('pwn')</script>" in text  # escaped in the file, back as text when parsed
    assert "\x1b" not in text and "[31m" not in text and "RED" in text  # ANSI colour codes removed, words kept
    assert any(el.tag in ("failure", "error") for el in root.iter())
    names = [el.get("name", "") for el in root.iter() if el.tag in ("testcase", "testsuite")]
    assert any("evil<script>x</script>" in n for n in names)
