"""Bad days, red-team round 2 (issue 16, p11): hand-broken artifacts whose shape the readers do not
check (a CSV whose ``ms`` are all inf, an ``fa2_thresholds.json`` with ``entries: 5``) no longer stop
``nsa-run report`` with an anonymous "unexpected" error: report.html is written without that section,
saying so and naming the file, and the CLI prints one line naming it."""

from __future__ import annotations

import json

import pytest

from nsa_runner.manifest import RunManifest

BROKEN = {
    "i.csv": "case,status,T,ms\nx,PASS,1024,inf\ny,PASS,2048,inf\n",
    "fa2_thresholds.json": '{"schema_version": 1, "entries": 5}',
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_table_or_plot_is_left_out_naming_the_file(cli, tmp_path, name):
    out = tmp_path / "out"
    run = out / "testrun"
    run.mkdir(parents=True)
    m = RunManifest.create(run, "testrun", ["nsa-run", "oneshot"], device="cpu", profile="quick")
    (run / name).write_text(BROKEN[name])
    stage = "fa2-probe" if name.startswith("fa2") else "prefill-bench"
    m.record({"name": stage, "status": "PASS", "order": 1, "source": "built-in", "reason": "ok",
              "files": [name], "duration_s": 1.0})
    m.finish()
    r = cli("report", "testrun", "--out", out)
    assert r.exit_code == 0, r.stdout + r.stderr
    assert "unexpected" not in r.stderr
    assert name in r.stderr and "not shown" in r.stderr
    html = (run / "report.html").read_text()
    assert "not shown" in html and name in html and "<h2>Stages</h2>" in html


def test_compare_shows_a_hand_edited_sanity_check_of_another_type(cli, tmp_path):
    out = tmp_path / "out"
    for rid in ("aaaaaaa", "bbbbbbb"):
        run = out / rid
        run.mkdir(parents=True)
        m = RunManifest.create(run, rid, ["nsa-run", "oneshot"], device="cpu", profile="quick")
        (run / "sanity.json").write_text(json.dumps({"schema_version": 1, "checks": [
            {"check": [1], "ok": True, "rel_err": 1e-6, "tol": 1e-3, "detail": {"a": 1}}]}))
        m.record({"name": "sanity", "status": "PASS", "order": 1, "source": "built-in", "reason": "ok",
                  "files": ["sanity.json"], "duration_s": 1.0})
        m.finish()
    r = cli("compare", "aaaaaaa", "bbbbbbb", "--out", out)
    assert r.exit_code in (0, 1), r.stdout + r.stderr
    assert "unexpected" not in r.stderr
