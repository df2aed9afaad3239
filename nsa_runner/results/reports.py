"""Write a run's summary.md, summary.json and junit.xml from its manifest (every exit path)."""

from __future__ import annotations

from pathlib import Path

from nsa_runner.artifacts import to_json_text, write_text
from nsa_runner.results import JUNIT_XML, SUMMARY_JSON, SUMMARY_MD
from nsa_runner.results.junit import junit_xml
from nsa_runner.results.summary import markdown, summary_json


def render_run_reports(folder: Path, m: dict) -> dict[str, str]:
    """The texts of summary.md, junit.xml and summary.json over every stage recorded in manifest
    ``m``, rendered in memory (nothing written): a caller that must write all or nothing renders
    first. Raises ValueError for a manifest they cannot show (e.g. a NaN metric)."""
    return {SUMMARY_MD: markdown(m), JUNIT_XML: junit_xml(m, Path(folder)), SUMMARY_JSON: to_json_text(summary_json(m))}


def write_run_reports(folder: Path, m: dict) -> list[Path]:
    """summary.md, summary.json and junit.xml over every stage recorded in manifest ``m``.

    Called by the CLI at the end of every ``oneshot`` / ``stage`` (also after Ctrl-C and when the
    ``summary`` stage was skipped), so the three agree with the closing counts line.
    """
    folder = Path(folder)
    return [write_text(folder / name, text) for name, text in render_run_reports(folder, m).items()]
