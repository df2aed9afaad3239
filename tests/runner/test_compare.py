"""nsa-run compare: marks (+ - ! * x ~), thresholds and spreads, comparability, outputs, exit codes,
baselines. Runs are fabricated in tmp (tests/_runfolders.py); B is a copy of A with edited numbers."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from typer.testing import CliRunner

from nsa_runner import baseline as bl
from nsa_runner._readers import Run
from nsa_runner.cli import app
from nsa_runner.compare import Settings, compare_runs, judge_time, to_markdown

try:  # tests/ is on sys.path under pytest's default (prepend) import mode
    from _runfolders import GPU, edit_csv, make_run, snapshot
except ImportError:  # pragma: no cover - run as a package
    from tests._runfolders import GPU, edit_csv, make_run, snapshot


@pytest.fixture
def out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "runs"
    make_run(root, "aaaaaaa")
    return root


def copy(out, src="aaaaaaa", dst="bbbbbbb"):
    """B = a copy of A (then edited by the test)."""
    shutil.copytree(out / src, out / dst)
    m = json.loads((out / dst / "manifest.json").read_text())
    m["run_id"] = dst
    (out / dst / "manifest.json").write_text(json.dumps(m))
    return out / dst


def cli(*args):
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.output
    return r


def as_json(out, *args) -> tuple[int, dict]:
    r = cli("compare", *args, "--out", out, "--json")
    return r.exit_code, json.loads(r.stdout)


def rows(doc, section=None, source=None, metric=None, key=None):
    return [r for r in doc["rows"] if (section is None or r["section"] == section)
            and (source is None or r["source"] == source) and (metric is None or r["metric"] == metric)
            and (key is None or r["key"] == key)]


def scale(col, f, where=None):
    """Multiply column ``col`` (and its recorded p20/p80 spread, if any) by ``f`` where ``where(df)``."""
    spread = {"ms_step": ("ms_step_p20", "ms_step_p80"), "ms": ("p20", "p80")}.get(col, ())

    def fn(df):
        m = slice(None) if where is None else where(df)
        for c in (col, *spread):
            df.loc[m, c] = df.loc[m, c] * f
        return df
    return fn


# ---- a run against itself / an identical copy -------------------------------------------------


def test_identical_runs_no_marks_exit_0(out):
    copy(out)
    code, doc = as_json(out, "aaaaaaa", "bbbbbbb")
    assert code == 0 and doc["regressions"] == 0
    timing = rows(doc, "timing")
    assert len(timing) > 20 and all(r["ratio"] == 1.0 and r["mark"] == "" for r in timing)
    parity = rows(doc, "parity")
    assert all(r["mark"] == "" for r in parity)
    assert {r["key"] for r in rows(doc, "stage")} >= {"triton-fwd", "decode-bench", "fa2-probe"}
    # the SKIP stage stays a SKIP, worded as such
    (skip,) = rows(doc, "stage", key="fa2-probe")
    assert (skip["a"], skip["b"]) == ("SKIP", "SKIP") and "skipped in both" in skip["note"]


def test_run_against_itself(out):
    code, doc = as_json(out, "aaaaaaa", str(out / "aaaaaaa"))
    assert code == 0
    assert any("same run folder" in n for n in doc["notes"])


# ---- timings ----------------------------------------------------------------------------------


def test_slower_decode_is_a_regression(out):
    b = copy(out)
    edit_csv(b / "decode.csv", scale("ms_step", 1.5, lambda df: df.S == 65536))
    code, doc = as_json(out, "aaaaaaa", "bbbbbbb")
    assert code == 1
    (r,) = rows(doc, "timing", "decode.csv", "ms_step", "S=65536")
    assert r["mark"] == "+" and r["ratio"] == pytest.approx(1.5) and "slower" in r["note"]
    others = [x for x in rows(doc, "timing", "decode.csv", "ms_step") if x["key"] != "S=65536"]
    assert all(x["mark"] == "" for x in others)
    assert doc["regressions"] == 1


def test_within_threshold_and_threshold_option(out):
    b = copy(out)
    edit_csv(b / "bench_selection.csv", scale("ms", 1.08, lambda df: df.impl == "ours"))
    code, doc = as_json(out, "aaaaaaa", "bbbbbbb")
    assert code == 0 and all(r["mark"] == "" for r in rows(doc, "timing", "bench_selection.csv"))
    code, doc = as_json(out, "aaaaaaa", "bbbbbbb", "--threshold", "5%")
    marks = {r["key"]: r["mark"] for r in rows(doc, "timing", "bench_selection.csv")}
    assert code == 1 and marks["T=8192 pass=fwd impl=ours"] == "+" and marks["T=8192 pass=fwd impl=sdpa-flash"] == ""


def test_beyond_threshold_but_within_spread_is_tilde(out):
    b = copy(out)

    def noisy(df):  # 15% slower, but B's run was noisy: its p20..p80 covers A's median
        m = df.S == 4096
        df.loc[m, "ms_step_p20"] = df.loc[m, "ms_step"] * 0.9
        df.loc[m, "ms_step"] = df.loc[m, "ms_step"] * 1.15
        df.loc[m, "ms_step_p80"] = df.loc[m, "ms_step"] * 1.3
        return df

    edit_csv(b / "decode.csv", noisy)
    code, doc = as_json(out, "aaaaaaa", "bbbbbbb")
    (r,) = rows(doc, "timing", "decode.csv", "ms_step", "S=4096")
    assert r["mark"] == "~" and "A inside B's p20..p80" in r["note"]
    assert code == 0


def test_faster_is_better_not_a_regression(out):
    b = copy(out)
    edit_csv(b / "decode.csv", scale("ms_sel", 0.5))
    code, doc = as_json(out, "aaaaaaa", "bbbbbbb")
    assert code == 0
    assert {r["mark"] for r in rows(doc, "timing", "decode.csv", "ms_sel")} == {"-"}


def test_derived_speedup_is_shown_not_judged_its_components_are(out):
    """speedup = ms_full / ms_attn has no spread of its own: a change in it alone (noise in a
    same-commit rerun) is never a regression; a slower component is, in its own row (issue 12)."""
    b = copy(out)
    edit_csv(b / "decode.csv", scale("speedup", 0.7))
    code, doc = as_json(out, "aaaaaaa", "bbbbbbb")
    sp = rows(doc, "timing", "decode.csv", "speedup")
    assert code == 0 and {r["mark"] for r in sp} == {""} and all("derived" in r["note"] for r in sp)
    assert all(abs(r["ratio"] - 0.7) < 1e-9 for r in sp)  # still shown, with its B/A
    edit_csv(b / "decode.csv", scale("ms_full", 1.5))
    code, doc = as_json(out, "aaaaaaa", "bbbbbbb")
    assert code == 1 and {r["mark"] for r in rows(doc, "timing", "decode.csv", "ms_full")} == {"+"}


def test_same_commit_cpu_rerun_reports_no_timing_regression(out):
    """CPU timings swing several-fold between reruns of one commit (issue 12): shown with B/A, never
    marked; the deterministic read counters are still judged."""
    for rid in ("aaaaaaa",):
        m = json.loads((out / rid / "manifest.json").read_text())
        m["device"] = "cpu"
        (out / rid / "manifest.json").write_text(json.dumps(m))
    b = copy(out)
    edit_csv(b / "decode.csv", scale("ms_sel", 3.0))
    edit_csv(b / "decode.csv", scale("ms_step", 0.2))
    code, doc = as_json(out, "aaaaaaa", "bbbbbbb")
    timing = [r for r in doc["rows"] if r["section"] == "timing" and r["metric"].startswith("ms")]
    assert code == 0 and timing and {r["mark"] for r in timing} == {""}
    sel = rows(doc, "timing", "decode.csv", "ms_sel")
    assert all(abs(r["ratio"] - 3.0) < 1e-9 and "CPU timing, not judged" in r["note"] for r in sel)
    assert any("timed on a CPU" in n for n in doc["notes"])
    edit_csv(b / "decode.csv", lambda df: df.assign(reads_sel=df.reads_sel + 64))
    code, doc = as_json(out, "aaaaaaa", "bbbbbbb")
    assert code == 1 and {r["mark"] for r in rows(doc, "timing", "decode.csv", "reads_sel")} == {"+"}


def test_read_counter_change_is_flagged(out):
    b = copy(out)
    edit_csv(b / "decode.csv", lambda df: df.assign(reads_sel=df.reads_sel + 64))
    code, doc = as_json(out, "aaaaaaa", "bbbbbbb")
    assert code == 1 and {r["mark"] for r in rows(doc, "timing", "decode.csv", "reads_sel")} == {"+"}


def test_judge_time_unit():
    assert judge_time(1.0, 1.2, 0.1)[1] == "+"
    assert judge_time(1.0, 1.05, 0.1)[1] == ""
    assert judge_time(1.0, 0.8, 0.1)[1] == "-"
    assert judge_time(1.0, 1.2, 0.1, spread_a=(0.9, 1.25))[1] == "~"  # B inside A's spread
    assert judge_time(1.0, 1.2, 0.1, spread_a=(0.9, 1.1), spread_b=(1.15, 1.3))[1] == "+"
    assert judge_time(2.0, 1.5, 0.1, higher_is_better=True)[1] == "+"


# ---- parity and statuses ------------------------------------------------------------------


def test_parity_error_worse_by_more_than_2x(out):
    b = copy(out)
    case3 = "B2-T70-HQ4-G2-dk24-dv16-fp32-n4-l16"
    edit_csv(b / "triton_fwd.csv", scale("rel_err", 3.0, lambda df: df.case == case3))
    edit_csv(b / "triton_bwd.csv", scale("rel_err", 1.5, lambda df: df.case == case3))
    code, doc = as_json(out, "aaaaaaa", "bbbbbbb")
    assert code == 1
    (fwd,) = rows(doc, "parity", "triton_fwd.csv", key=case3)
    (bwd,) = rows(doc, "parity", "triton_bwd.csv", key=case3)
    assert fwd["mark"] == "+" and fwd["ratio"] == pytest.approx(3.0)
    assert bwd["mark"] == "" and bwd["ratio"] == pytest.approx(1.5)
    code, doc = as_json(out, "aaaaaaa", "bbbbbbb", "--parity-factor", "4")
    assert code == 0


def test_noise_floor_zero_error(out):
    b = copy(out)
    case = "B2-T70-HQ4-G2-dk24-dv16-fp32-n4-l16"
    edit_csv(out / "aaaaaaa" / "triton_fwd.csv", lambda df: df.assign(rel_err=df.rel_err.where(df.case != case, 0.0)))
    edit_csv(b / "triton_fwd.csv", lambda df: df.assign(rel_err=df.rel_err.where(df.case != case, 1e-12)))
    code, doc = as_json(out, "aaaaaaa", "bbbbbbb")
    (r,) = rows(doc, "parity", "triton_fwd.csv", key=case)
    assert r["mark"] == "" and code == 0  # both below tol/1000: round-off, not a 2x regression


def test_newly_failing_and_fixed(out):
    make_run(out, "bbbbbbb", statuses={"triton-bwd": "FAIL"})
    make_run(out, "ccccccc", statuses={"triton-bwd": "FAIL"})
    edit_csv(out / "bbbbbbb" / "triton_fwd.csv",
             lambda df: df.assign(status=df.status.where(df.case != "B1-T50-HQ2-G2-dk16-dv32-fp16-n4-l16", "FAIL")))
    code, doc = as_json(out, "aaaaaaa", "bbbbbbb")
    assert code == 1
    assert rows(doc, "stage", key="triton-bwd")[0]["mark"] == "!"
    assert rows(doc, "parity", "triton_fwd.csv", key="B1-T50-HQ2-G2-dk16-dv32-fp16-n4-l16")[0]["mark"] == "!"
    code, doc = as_json(out, "bbbbbbb", "aaaaaaa")
    assert code == 0
    assert rows(doc, "stage", key="triton-bwd")[0]["mark"] == "*"
    assert rows(doc, "parity", "triton_fwd.csv", key="B1-T50-HQ2-G2-dk16-dv32-fp16-n4-l16")[0]["mark"] == "*"
    code, doc = as_json(out, "bbbbbbb", "ccccccc")  # still failing: not a new regression
    (r,) = rows(doc, "stage", key="triton-bwd")
    assert r["mark"] == "" and "still failing" in r["note"]


def test_pass_to_skip_is_not_comparable_never_a_pass(out):
    make_run(out, "bbbbbbb", statuses={"decode-bench": "SKIP"})
    code, doc = as_json(out, "aaaaaaa", "bbbbbbb")
    (r,) = rows(doc, "stage", key="decode-bench")
    assert r["mark"] == "x" and "skipped in B" in r["note"]


def test_case_definition_changed_is_x(out):
    b = copy(out)
    case = "B1-T2K-HQ64-G4-dk192-dv128-bf16-n16-l64"
    edit_csv(b / "triton_fwd.csv", lambda df: df.assign(T=df["T"].where(df.case != case, 4096),
                                                        rel_err=df.rel_err * 5))
    code, doc = as_json(out, "aaaaaaa", "bbbbbbb")
    (r,) = rows(doc, "parity", "triton_fwd.csv", key=case)
    assert r["mark"] == "x" and "T 2048 -> 4096" in r["note"]


def test_key_columns_changed_is_x(out):
    b = copy(out)
    edit_csv(b / "decode.csv", lambda df: df.assign(HQ=64))
    code, doc = as_json(out, "aaaaaaa", "bbbbbbb")
    (r,) = rows(doc, "timing", "decode.csv")
    assert r["mark"] == "x" and "key columns" in r["note"]


def test_file_only_on_one_side(out):
    b = copy(out)
    (b / "bench_selection.csv").unlink()
    code, doc = as_json(out, "aaaaaaa", "bbbbbbb")
    (r,) = rows(doc, "timing", "bench_selection.csv")
    assert r["mark"] == "x" and "not in B" in r["note"] and code == 0


# ---- comparability ----------------------------------------------------------------------------


def test_different_gpu_is_never_a_fake_change(out):
    make_run(out, "bbbbbbb", gpu="NVIDIA A100-SXM4-80GB", time_scale=3.0, err_scale=5.0)
    code, doc = as_json(out, "aaaaaaa", "bbbbbbb")
    assert code == 0 and doc["regressions"] == 0
    assert all(r["mark"] == "x" for r in rows(doc, "timing"))
    assert all(r["mark"] in ("x", "") for r in rows(doc, "parity"))
    assert any(GPU in n and "A100" in n for n in doc["notes"])


def test_different_profile_is_x(out):
    make_run(out, "bbbbbbb", profile="quick", time_scale=2.0)
    code, doc = as_json(out, "aaaaaaa", "bbbbbbb")
    assert code == 0 and all(r["mark"] == "x" for r in rows(doc, "timing"))


def test_stage_rerun_with_other_settings_is_x(out):
    b = copy(out)
    for folder, rerun in ((out / "aaaaaaa", False), (b, True)):
        m = json.loads((folder / "manifest.json").read_text())
        for s in m["stages"]:  # B: decode-bench re-run into the folder with `nsa-run stage ... --profile quick`
            s.update(device="cuda", profile="quick" if rerun and s["name"] == "decode-bench" else "full")
        (folder / "manifest.json").write_text(json.dumps(m))
    edit_csv(b / "decode.csv", scale("ms_step", 0.2))
    code, doc = as_json(out, "aaaaaaa", "bbbbbbb")
    (r,) = rows(doc, "timing", "decode.csv")
    assert r["mark"] == "x" and "profile=quick" in r["note"] and code == 0


def test_cpu_vs_cuda_not_comparable(out):
    make_run(out, "ccccccc", device="cpu")
    code, doc = as_json(out, "aaaaaaa", "ccccccc")
    assert code == 0 and any("cpu" in n for n in doc["notes"])


# ---- outputs --------------------------------------------------------------------------------------


def _rendered(markdown: str) -> str:
    """The text a markdown renderer shows for backslash-escaped characters (``\\.`` is ``.``); an escaped
    ``|`` stays escaped (a cell's own pipe)."""
    return re.sub(r"\\([^|])", r"\1", markdown)


def test_markdown_and_table_outputs(out):
    b = copy(out)
    edit_csv(b / "decode.csv", scale("ms_step", 2.0))
    r = cli("compare", "aaaaaaa", "bbbbbbb", "--out", out, "--markdown")
    assert r.exit_code == 1
    # markdown metacharacters in the text are backslash-escaped (summary.md's one rule): read as rendered
    assert "| + | decode\\.csv | S=1024 | ms\\_step |" in r.stdout
    shown = _rendered(r.stdout)
    assert "| + | decode.csv | S=1024 | ms_step |" in shown
    assert "| | source | key | metric | A | B | B/A | note |" in shown
    lines = shown.strip().splitlines()
    assert lines[-1] == "**4 regression(s): 4 worse (+)**"
    assert lines[2] == lines[-1]  # the verdict first (after the title), and again last
    assert "ms_cmp" not in shown and "unchanged row(s) not shown (--all shows them)" in shown
    r = cli("compare", "aaaaaaa", "bbbbbbb", "--out", out, "--markdown", "--all")
    shown = _rendered(r.stdout)
    assert "| decode.csv | S=1024 | ms_cmp |" in shown and "not shown" not in shown
    r = cli("compare", "aaaaaaa", "bbbbbbb", "--out", out)
    assert r.exit_code == 1 and "decode.csv" in r.stdout
    out_lines = [x for x in r.stdout.splitlines() if x.strip()]
    assert out_lines[1].startswith("4 regression(s)")  # verdict right under the title
    assert "ms_cmp" not in r.stdout
    r = cli("compare", "aaaaaaa", "bbbbbbb", "--out", out, "--only-changed")  # old scripts keep working
    assert r.exit_code == 1


def test_markdown_library_escapes_pipes(out):
    cmp = compare_runs(Run.open(out / "aaaaaaa"), Run.open(out / "aaaaaaa"), Settings())
    cmp.rows[0].note = "a|b"
    assert "a\\|b" in to_markdown(cmp, show_all=True)  # an unchanged row: shown with --all


@pytest.mark.parametrize("args,msg", [
    (["--threshold", "ten"], "--threshold 'ten'"),
    (["--threshold", "-5%"], "between 0"),
    (["--parity-factor", "0.5"], "parity factor must be"),
    (["--markdown", "--json"], "exclusive"),
])
def test_bad_options_exit_2(out, args, msg):
    copy(out)
    r = cli("compare", "aaaaaaa", "bbbbbbb", "--out", out, *args)
    assert r.exit_code == 2 and msg in r.output


def test_needs_b_or_baseline(out):
    r = cli("compare", "aaaaaaa", "--out", out)
    assert r.exit_code == 2 and "needs run B" in r.output


# ---- baselines ----------------------------------------------------------------------------------


def test_baseline_roundtrip_and_regression(out, tmp_path):
    base = tmp_path / "h100.json"
    r = cli("compare", "aaaaaaa", "--out", out, "--save-baseline", base)
    assert r.exit_code == 0 and base.is_file()
    data = bl.load(base)
    figs = data["machines"][GPU]["figures"]
    assert {f["file"] for f in figs} == {"decode.csv", "bench_selection.csv", "fa2_bench.csv"}
    assert all(f["tolerance"] == 0.0 for f in figs if f["metric"].startswith("reads_"))
    # the same run against its own baseline: nothing flagged
    code, doc = as_json(out, "aaaaaaa", "--baseline", base)
    assert code == 0 and rows(doc, "baseline") and all(r["mark"] == "" for r in rows(doc, "baseline"))
    # a slower B: flagged against the baseline too
    b = copy(out)
    edit_csv(b / "bench_selection.csv", scale("ms", 1.3, lambda df: (df.impl == "ours") & (df["T"] == 32768)))
    code, doc = as_json(out, "bbbbbbb", "--baseline", base)
    assert code == 1
    bad = [r for r in rows(doc, "baseline") if r["mark"] == "+"]
    assert [(r["source"], r["key"]) for r in bad] == [("bench_selection.csv", "T=32768 pass=fwd impl=ours"),
                                                      ("bench_selection.csv", "T=32768 pass=fwd+bwd impl=ours")]
    code, doc = as_json(out, "aaaaaaa", "bbbbbbb", "--baseline", base)  # both sections at once
    assert code == 1 and rows(doc, "timing") and rows(doc, "baseline")


def test_baseline_other_gpu_is_x_not_a_pass(out, tmp_path):
    base = tmp_path / "h100.json"
    assert cli("compare", "aaaaaaa", "--out", out, "--save-baseline", base).exit_code == 0
    make_run(out, "ccccccc", gpu="NVIDIA H200", time_scale=2.0)
    code, doc = as_json(out, "ccccccc", "--baseline", base)
    (r,) = rows(doc, "baseline")
    assert code == 0 and r["mark"] == "x" and "no figures for NVIDIA H200" in r["note"]


def test_save_baseline_never_overwrites(out, tmp_path):
    base = tmp_path / "b.json"
    base.write_text("precious")
    r = cli("compare", "aaaaaaa", "--out", out, "--save-baseline", base)
    assert r.exit_code == 2 and "nothing was overwritten" in r.output
    assert base.read_text() == "precious"


@pytest.mark.parametrize("text,msg", [
    ('{"schema_version": 1, "kind": "nsa-run-baseline", "machines": {}}', "non-empty"),
    ('{"schema_version": 2, "kind": "nsa-run-baseline", "machines": {"x": {"figures": []}}}', "schema_version 2"),
    ('{"schema_version": 1, "kind": "other", "machines": {"x": {"figures": []}}}', "kind"),
    ('{"schema_version": 1, "kind": "nsa-run-baseline", "machines": {"x": {"figures": [{"file": "../x.csv", '
     '"key": {}, "metric": "ms", "value": 1}]}}}', "file"),
    ('{"schema_version": 1, "kind": "nsa-run-baseline", "machines": {"x": {"figures": [{"file": "d.csv", '
     '"key": {}, "metric": "ms", "value": -1}]}}}', "value"),
    ('{"schema_version": 1, "kind": "nsa-run-baseline", "machines": {"x": {"figures": [{"file": "d.csv", '
     '"key": {}, "metric": "ms", "value": 1, "tolerance": "big"}]}}}', "tolerance"),
    ('{"schema_version": 1, "kind": "nsa-run-', "not valid JSON"),
])
def test_bad_baseline_file_exit_2(out, tmp_path, text, msg):
    p = tmp_path / "base.json"
    p.write_text(text)
    before = snapshot(out)
    r = cli("compare", "aaaaaaa", "--out", out, "--baseline", p)
    assert r.exit_code == 2 and msg in r.output
    assert snapshot(out) == before


def test_baseline_partial_key_matching_two_rows_is_an_error(out, tmp_path):
    p = tmp_path / "base.json"
    p.write_text(json.dumps({"schema_version": 1, "kind": "nsa-run-baseline", "machines": {GPU: {"figures": [
        {"file": "bench_selection.csv", "key": {"T": 8192}, "metric": "ms", "value": 1.0}]}}}))
    r = cli("compare", "aaaaaaa", "--out", out, "--baseline", p)
    assert r.exit_code == 2 and "matches 4 rows" in r.output
