"""Write a run's summary.md, summary.json and junit.xml from its manifest (every exit path)."""

from __future__ import annotations

from pathlib import Path

from nsa_runner.artifacts import runner_died, to_json_text, unfinished, write_text
from nsa_runner.results import JUNIT_XML, SUMMARY_JSON, SUMMARY_MD
from nsa_runner.results.junit import junit_xml
from nsa_runner.results.summary import markdown, summary_json

# every manifest field summary.md, summary.json or junit.xml shows (``markdown``, ``summary_json``,
# ``junit_xml``): the run's own and every stage's entry. ``reports_of`` is a digest of them: a field left
# out (run id, started, host, device, profile, command) let ``report`` keep summaries that disagreed
# with manifest.json, saying "kept" (round 14 B R9)
SHOWN_FIELDS = ("run_id", "started", "finished", "argv", "host", "device", "profile", "interrupted", "stages")


def reports_digest(m: dict) -> str:
    """A digest of what summary.md / junit.xml / summary.json show of manifest ``m``: ``SHOWN_FIELDS``,
    and the unfinished / runner-died lines (incomplete, or a runner that died, which ``pending`` /
    ``runner`` / ``finished`` and the processes on this host tell). The runner records it as
    ``reports_of`` when it writes them; ``nsa-run report`` writes them again when it differs."""
    import hashlib
    import json

    shown = {k: m.get(k) for k in SHOWN_FIELDS}
    shown["unfinished"] = unfinished(m)
    shown["runner_died"] = runner_died(m)
    return hashlib.sha256(json.dumps(shown, sort_keys=True, default=str).encode("utf-8", "backslashreplace")
                          ).hexdigest()[:16]


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
