"""Write a run's summary.md, summary.json and junit.xml from its manifest (every exit path)."""

from __future__ import annotations

from pathlib import Path

from nsa_runner.artifacts import write_json, write_text
from nsa_runner.results import JUNIT_XML, SUMMARY_JSON, SUMMARY_MD
from nsa_runner.results.junit import junit_xml
from nsa_runner.results.summary import markdown, summary_json


def write_run_reports(folder: Path, m: dict) -> list[Path]:
    """summary.md, summary.json and junit.xml over every stage recorded in manifest ``m``.

    Called by the CLI at the end of every ``oneshot`` / ``stage`` (also after Ctrl-C and when the
    ``summary`` stage was skipped), so the three agree with the closing counts line.
    """
    folder = Path(folder)
    texts = {SUMMARY_MD: markdown(m), JUNIT_XML: junit_xml(m, folder)}
    doc = summary_json(m)
    return [write_text(folder / name, text) for name, text in texts.items()] + [write_json(folder / SUMMARY_JSON, doc)]
