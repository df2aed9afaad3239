"""nsa-run report: one self-contained report.html (embedded PNG plots, inline CSS, no external URL),
statuses prominent and SKIP never styled or worded like PASS; summary.md never clobbered."""

from __future__ import annotations

import base64
import json
import re

import pytest
from typer.testing import CliRunner

from nsa_runner import report as rp
from nsa_runner._readers import Run
from nsa_runner.cli import app

try:  # tests/ is on sys.path under pytest's default (prepend) import mode
    from _runfolders import decode_rows, make_run, snapshot
except ImportError:  # pragma: no cover - run as a package
    from tests._runfolders import decode_rows, make_run, snapshot

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path / "runs"


def cli(*args):
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.output
    return r


def _html(folder) -> str:
    return (folder / "report.html").read_text(encoding="utf-8")


def test_report_is_self_contained_with_plots(out):
    folder = make_run(out, "aaaaaaa", statuses={"triton-bwd": "FAIL"})
    r = cli("report", "aaaaaaa", "--out", out)
    assert r.exit_code == 0, r.output
    assert "report.html" in r.stdout and r.stdout.strip().splitlines()[-1] == "5 passed, 1 failed, 1 skipped"
    html = _html(folder)
    # no external resource of any kind: no scripts, no stylesheets, no remote src/href
    assert "<script" not in html and "<link" not in html and "@import" not in html
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:|//)""", html, re.I)
    assert "url(" not in html
    srcs = re.findall(r'<img alt="([^"]*)" src="([^"]*)"', html)
    assert len(srcs) >= 4, [a for a, _ in srcs]  # parity, decode, fa2 bench, kernel bench
    for alt, src in srcs:
        assert src.startswith("data:image/png;base64,"), alt
        assert base64.b64decode(src.split(",", 1)[1]).startswith(PNG), alt
    alts = " ".join(a for a, _ in srcs)
    assert "parity errors per case" in alts and "decode latency and reads vs S" in alts
    assert "bench_selection.csv times" in alts
    # the failure is prominent: red banner and the log tail
    assert '<div class="banner bad">FAILED: 5 passed, 1 failed, 1 skipped' in html
    assert "AssertionError: boom" in html
    # URLs in artifact text stay text (escaped), never links
    assert "https://example.org" in html and 'href="https://example.org' not in html


def test_skip_is_never_styled_or_worded_as_pass(out):
    folder = make_run(out, "aaaaaaa")
    assert cli("report", "aaaaaaa", "--out", out).exit_code == 0
    html = _html(folder)
    skip_rows = re.findall(r'<tr class="row-SKIP">.*?</tr>', html.replace("\n", " "))
    (row,) = [r for r in skip_rows if "fa2-probe" in r]
    assert '<span class="badge SKIP">SKIP — not run</span>' in row
    assert "PASS" not in row and "#1a7f37" not in row
    # a skipped parity case is a SKIP badge too, and is counted apart from the passes
    assert "triton_fwd.csv: 3 passed, 0 failed, 1 skipped (not run)" in html
    assert all("SKIP — not run" in r and "badge PASS" not in r for r in skip_rows)
    # the banner does not say PASSED when something was skipped
    assert "NO FAILURE, BUT NOT EVERYTHING RAN" in html and "PASSED" not in html
    assert "skipped (not validated on this run): fa2-probe" in html
    # CSS: SKIP is not green
    skip_css = re.search(r"\.SKIP\{([^}]*)\}", html).group(1)
    assert "1a7f37" not in skip_css


def test_all_pass_banner(out):
    folder = make_run(out, "aaaaaaa", statuses={"fa2-probe": "PASS"})
    assert cli("report", "aaaaaaa", "--out", out).exit_code == 0
    assert '<div class="banner ok">PASSED: 7 passed, 0 failed, 0 skipped' in _html(folder)


def test_summary_md_is_kept_when_present(out):
    folder = make_run(out, "aaaaaaa")
    before = (folder / "summary.md").read_bytes()
    r = cli("report", "aaaaaaa", "--out", out)
    assert r.exit_code == 0 and "kept" in r.stdout
    assert (folder / "summary.md").read_bytes() == before


def test_summary_md_written_when_absent_with_the_runners_renderer(out):
    from nsa_runner.results import summary as s

    folder = make_run(out, "aaaaaaa", only=("env-pairing", "sanity", "triton-fwd"))
    (folder / "summary.md").unlink()
    r = cli("report", "aaaaaaa", "--out", out, "--json")
    info = json.loads(r.stdout)
    assert r.exit_code == 0 and info["summary_written"] is True
    run = Run.open(folder)
    assert (folder / "summary.md").read_text() == s.markdown(run.manifest)
    assert "**3 passed, 0 failed, 0 skipped**" in (folder / "summary.md").read_text()
    # the second time it exists: kept
    before = (folder / "summary.md").read_bytes()
    assert json.loads(cli("report", "aaaaaaa", "--out", out, "--json").stdout)["summary_written"] is False
    assert (folder / "summary.md").read_bytes() == before


def test_absent_artifacts_say_not_in_this_run(out):
    folder = make_run(out, "aaaaaaa", only=("env-pairing",))
    for f in ("decode.csv", "bench_selection.csv", "fa2_bench.csv", "triton_fwd.csv", "triton_bwd.csv"):
        (folder / f).unlink()
    assert cli("report", str(folder)).exit_code == 0
    html = _html(folder)
    for what in ("decode.csv: not in this run", "triton_fwd.csv: not in this run",
                 "benchmark CSVs (prefill.csv, fa2_bench.csv, plugin tables, bench_*.csv): not in this run",
                 "selection.png (Selection picture (selection-map stage)): not in this run"):
        assert what in html


def test_report_rewrites_only_its_own_files(out):
    folder = make_run(out, "aaaaaaa")
    before = snapshot(folder)
    assert cli("report", "aaaaaaa", "--out", out).exit_code == 0
    after = snapshot(folder)
    assert set(after) - set(before) == {"report.html"}
    assert {k: v for k, v in after.items() if k != "report.html"} == before


def test_corrupt_png_is_an_error(out):
    folder = make_run(out, "aaaaaaa")
    (folder / "selection.png").write_bytes(b"not a png")
    r = cli("report", "aaaaaaa", "--out", out)
    assert r.exit_code == 2 and "selection.png: not a PNG" in r.output
    assert not (folder / "report.html").exists()


def test_plot_helpers_return_png():
    import pandas as pd

    for b64 in (rp.plot_decode(pd.DataFrame(decode_rows())),
                rp.plot_parity([("x", [{"case": "a", "status": "PASS", "rel_err": 1e-6, "tol": 1e-5},
                                       {"case": "b", "status": "SKIP", "rel_err": float("nan"),
                                        "tol": float("nan")}])])):
        assert base64.b64decode(b64).startswith(PNG)
    assert rp.plot_decode(pd.DataFrame({"x": [1]})) is None
    assert rp.plot_parity([("empty", [])]) is None


# ---- oneshot writes the report and checks --baseline at the end ------------------------------------

FAKE_DECODE = """
import os
from nsa_runner import Stage, StageResult, Status
from nsa_runner.artifacts import write_csv

class FakeDecode(Stage):
    name, order = "fake-decode", 60
    def run(self, ctx):
        f = float(os.environ.get("NSA_TEST_SLOWDOWN", "1"))
        write_csv(ctx.dir / "decode.csv", [{"S": 1024, "B": 1, "ms_step": 0.2 * f, "reads_sel": 1024},
                                           {"S": 4096, "B": 1, "ms_step": 0.3 * f, "reads_sel": 1024}])
        return StageResult(Status.PASS, "decoded", files=["decode.csv"])
"""


@pytest.fixture
def fake_decode(plugins):
    plugins.make("fake-decode", "fake_decode_mod", FAKE_DECODE, {"fake-decode": "fake_decode_mod:FakeDecode"})
    return plugins


def test_oneshot_writes_report_and_guards_baseline(fake_decode, cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "runs"
    r = cli("oneshot", "--only", "fake-decode", "--out", out, "--device", "cpu")
    assert r.exit_code == 0, r.output
    assert (out / "testrun" / "report.html").is_file() and (out / "testrun" / "summary.md").is_file()
    assert "report:" in r.stderr and "passed" not in r.stderr  # the counts line is printed once, on stdout, last
    assert r.stdout.strip().splitlines()[-1] == "1 passed, 0 failed, 0 skipped"
    base = tmp_path / "cpu.json"
    assert cli("compare", "testrun", "--out", out, "--save-baseline", base).exit_code == 0
    # same figures: passes; 40% slower: the baseline check fails the run (exit 1)
    r = cli("oneshot", "--only", "fake-decode", "--out", out, "--device", "cpu", "--baseline", base)
    assert r.exit_code == 0, r.output
    monkeypatch.setenv("NSA_TEST_SLOWDOWN", "1.4")
    r = cli("oneshot", "--only", "fake-decode", "--out", out, "--device", "cpu", "--baseline", base, "--json")
    assert r.exit_code == 1, r.output
    assert json.loads(r.stdout)["exit_code"] == 1  # the JSON carries the verdict after the baseline check
    err = " ".join(r.stderr.split())
    assert "baseline regression" in err and "2 regression(s): 2 worse (+)" in err
    for S in (1024, 4096):
        assert f"│ + │ decode.csv │ S={S} B=1 │ ms_step" in r.stderr
    assert (out / "testrun.3" / "report.html").is_file()


def test_oneshot_bad_baseline_exit_2_before_running(fake_decode, cli, tmp_path):
    out = tmp_path / "runs"
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1, "kind": "nsa-run-baseline", "machines": {}}')
    r = cli("oneshot", "--only", "fake-decode", "--out", out, "--device", "cpu", "--baseline", bad)
    assert r.exit_code == 2 and "--baseline" in r.stderr
    assert not out.exists() or not list(out.iterdir())
