"""Stage ``summary``: summary.md, summary.json and junit.xml over the stages recorded in the
run's manifest.json before it (the executor writes the manifest after every stage).

The renderers are the runner's (``nsa_runner.results``): when the run ends — also after Ctrl-C
or when this stage is skipped — the CLI rewrites the three files over every stage of the run,
this one included, so they always agree with the CLI's closing counts line. This stage is the
in-run step that proves the reports can be written (and leaves them behind if the runner is
killed before it ends). It PASSes when it wrote them, SKIPs when no stage ran before it, and
FAILs when the manifest is unusable.
"""

from __future__ import annotations

from nsa_runner.artifacts import ManifestError, load_manifest, write_json, write_text
from nsa_runner.results import JUNIT_XML, SUMMARY_JSON, SUMMARY_MD, counts
from nsa_runner.results.junit import junit_xml
from nsa_runner.results.summary import markdown, summary_json
from nsa_runner.stage import Stage, StageResult, Status


class Summary(Stage):
    name = "summary"
    order = 70
    preload = False  # imports no torch: a fresh process is faster than a spare still importing it
    requires = ()
    description = "summary.md / summary.json / junit.xml over all stages of the run"
    timeout_s = 120.0

    def run(self, ctx) -> StageResult:
        try:
            m = load_manifest(ctx.dir / "manifest.json")
        except ManifestError as e:
            return StageResult(Status.FAIL, f"cannot summarise: {e}")
        stages = [s for s in m["stages"] if s["name"] != self.name]
        m = {**m, "stages": stages}
        write_json(ctx.dir / SUMMARY_JSON, summary_json(m))
        write_text(ctx.dir / SUMMARY_MD, markdown(m))
        write_text(ctx.dir / JUNIT_XML, junit_xml(m, ctx.dir))
        files = [SUMMARY_MD, SUMMARY_JSON, JUNIT_XML]
        print(f"summary of {len(stages)} earlier stage(s) written; the run's end rewrites it over every stage")
        if not stages:
            return StageResult(Status.SKIP, "no stage ran before summary: nothing to summarise (reports are empty)",
                               files=files, hint="run it after other stages, e.g. nsa-run oneshot")
        return StageResult(Status.PASS, f"{', '.join(files)} written over the {len(stages)} earlier stage(s)",
                           files=files, metrics=counts(stages))
