"""Artifact readers (nsa_runner._readers): absent -> "not in this run", present and broken -> a clear
error naming the file; through the CLI: exit 2, no traceback, nothing written or deleted."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from nsa_runner._readers import ArtifactError, Run, check_run_id, read_csv, read_json, read_jsonl, resolve_run
from nsa_runner.cli import app

try:  # tests/ is on sys.path under pytest's default (prepend) import mode
    from _runfolders import make_run, snapshot
except ImportError:  # pragma: no cover - run as a package
    from tests._runfolders import make_run, snapshot


@pytest.fixture
def out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default --out is relative: keep it inside tmp
    root = tmp_path / "runs"
    make_run(root, "aaaaaaa")
    make_run(root, "bbbbbbb")
    return root


def cli(*args):
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.output
    return r


# ---- run arguments -------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["..", "../x", "a/b", "a/../b", "x..y", "", "-rf", "a b", "a\x00b", "a\\b"])
def test_bad_run_ids_rejected(bad):
    with pytest.raises(ArtifactError):
        check_run_id(bad)


@pytest.mark.parametrize("good", ["40e81ff", "40e81ff-dirty-6b9d72362e", "40e81ff-dirty-6b9d72362e.2",
                                  "nogit-0123abcd"])
def test_good_run_ids(good):
    assert check_run_id(good) == good


def test_resolve_by_id_and_by_path(out):
    assert resolve_run("aaaaaaa", out) == out / "aaaaaaa"
    assert resolve_run(str(out / "bbbbbbb"), out) == out / "bbbbbbb"


def test_resolve_errors_name_the_problem(out, tmp_path):
    with pytest.raises(ArtifactError, match="no run 'zzz' under .*runs there: aaaaaaa, bbbbbbb"):
        resolve_run("zzz", out)
    with pytest.raises(ArtifactError, match="not a run id"):
        resolve_run("../aaaaaaa/../nope", out)
    with pytest.raises(ArtifactError, match="not a run folder"):  # '..' exists, but holds no manifest
        resolve_run("..", out)
    (tmp_path / "plain").mkdir()
    with pytest.raises(ArtifactError, match="not a run folder"):
        resolve_run(str(tmp_path / "plain"), out)


@pytest.mark.parametrize("arg", ["..", "../../etc", "a/b", "aaaaaaa/..", "x..y"])
def test_cli_rejects_traversal_ids_exit_2_nothing_touched(out, arg):
    before = snapshot(out.parent)
    for cmd in (["report", arg], ["compare", arg, "aaaaaaa"], ["compare", "aaaaaaa", arg]):
        r = cli(*cmd, "--out", out)
        assert r.exit_code == 2, (cmd, r.output)
        assert "error:" in r.output
    assert snapshot(out.parent) == before


# ---- files -----------------------------------------------------------------------------------


def test_absent_files_are_not_in_this_run(out):
    run = Run.open(out / "aaaaaaa")
    assert run.csv("nothing.csv") is None
    assert run.json("nothing.json") is None
    assert run.jsonl("sel_ranges.jsonl") is None
    assert run.parity("triton_fwd.csv") is not None


def test_declared_but_missing_file_is_an_error(out):
    (out / "aaaaaaa" / "decode.csv").unlink()  # the manifest says decode-bench wrote it
    with pytest.raises(ArtifactError, match="decode.csv: the manifest lists it as written by stage 'decode-bench'"):
        Run.open(out / "aaaaaaa").timing("decode.csv")


def test_truncated_csv(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("case,B,rel_err\nx,1,0.5\ny,2,0.")
    with pytest.raises(ArtifactError, match="truncated"):
        read_csv(p)
    p.write_text("case,B,rel_err\nx,1,0.5\ny,2\n")
    with pytest.raises(ArtifactError, match="line 3 has 2 fields, the header has 3"):
        read_csv(p)
    p.write_text("")
    with pytest.raises(ArtifactError, match="empty"):
        read_csv(p)


def test_csv_content_checks(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("case,status,rel_err\nx,PASS,abc\n")
    with pytest.raises(ArtifactError, match="'rel_err' line 2: 'abc' is not a number"):
        read_csv(p, numeric=("rel_err",))
    p.write_text("case,status,rel_err\nx,OK,0.1\n")
    with pytest.raises(ArtifactError, match="'status' line 2: 'OK' is not one of PASS"):
        read_csv(p, status_col="status")
    with pytest.raises(ArtifactError, match="missing column"):
        read_csv(p, required=("case", "tol"))
    p.write_text("S,ms_step\n1024,fast\n")  # a timing column is numeric even when nobody says so
    with pytest.raises(ArtifactError, match="'ms_step' line 2"):
        read_csv(p)
    p.write_text("case,status,rel_err\nx,SKIP,\n")  # empty measurement of a skipped case is fine
    assert read_csv(p, numeric=("rel_err",), status_col="status")["rel_err"].isna().all()


def test_duplicate_parity_case_is_an_error(out):
    p = out / "aaaaaaa" / "triton_fwd.csv"
    lines = p.read_text().splitlines(keepends=True)
    p.write_text("".join(lines + [lines[1]]))
    with pytest.raises(ArtifactError, match="appears more than once"):
        Run.open(out / "aaaaaaa").parity("triton_fwd.csv")


def test_json_truncated_and_schema(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"schema_version": 1, "a": [1, 2')
    with pytest.raises(ArtifactError, match="not valid JSON, truncated or corrupt"):
        read_json(p)
    p.write_text('{"schema_version": 7}')
    with pytest.raises(ArtifactError, match="schema_version 7 is not supported"):
        read_json(p)
    p.write_text('{"a": 1}')
    with pytest.raises(ArtifactError, match="schema_version missing"):
        read_json(p)
    p.write_text("[1, 2]")
    with pytest.raises(ArtifactError, match="expected a JSON object"):
        read_json(p)
    p.write_bytes(b'{"schema_version": 1, "x": "\xff"}')
    with pytest.raises(ArtifactError, match="not UTF-8"):
        read_json(p)


def test_jsonl(tmp_path):
    p = tmp_path / "s.jsonl"
    p.write_text('{"schema_version": 1, "t": 0}\n{"schema_version": 1, "t": 1}\n')
    assert [r["t"] for r in read_jsonl(p)] == [0, 1]
    p.write_text('{"schema_version": 1, "t": 0}\n{"schema_version": 1, "t"')
    with pytest.raises(ArtifactError, match="truncated"):
        read_jsonl(p)
    p.write_text('{"schema_version": 2, "t": 0}\n')
    with pytest.raises(ArtifactError, match="line 1: schema_version 2"):
        read_jsonl(p)


def _corrupt(folder, name: str, how: str) -> None:
    p = folder / name
    if how == "truncate":
        data = p.read_bytes()
        p.write_bytes(data[: len(data) // 2])
    elif how == "schema":
        d = json.loads(p.read_text())
        d["schema_version"] = 99
        p.write_text(json.dumps(d))
    elif how == "delete":
        p.unlink()


CASES = [
    ("manifest.json", "truncate", "manifest.json"),
    ("manifest.json", "schema", "schema_version 99"),
    ("manifest.json", "delete", "not a run folder"),
    ("env.json", "truncate", "env.json: not valid JSON"),
    ("env.json", "schema", "env.json: schema_version 99"),
    ("sanity.json", "truncate", "sanity.json"),
    ("routing.json", "schema", "routing.json: schema_version 99"),
    ("triton_fwd.csv", "truncate", "triton_fwd.csv"),
    ("triton_bwd.csv", "delete", "triton_bwd.csv: the manifest lists it"),
    ("decode.csv", "truncate", "decode.csv"),
    ("bench_selection.csv", "truncate", "bench_selection.csv"),
]


@pytest.mark.parametrize("name,how,message", CASES, ids=[f"{n}-{h}" for n, h, _ in CASES])
def test_cli_broken_artifact_exit_2_nothing_written(out, name, how, message):
    folder = out / "bbbbbbb"
    _corrupt(folder, name, how)
    before = snapshot(out)
    for cmd in (["compare", "aaaaaaa", "bbbbbbb"], ["report", "bbbbbbb"], ["compare", "bbbbbbb", "aaaaaaa",
                                                                           "--json"]):
        r = cli(*cmd, "--out", out)
        assert r.exit_code == 2, (cmd, r.output)
        assert message in " ".join(r.output.split()), r.output
    assert snapshot(out) == before
    assert not (folder / "report.html").exists()


def test_report_keeps_existing_report_when_an_artifact_breaks(out):
    folder = out / "aaaaaaa"
    assert cli("report", "aaaaaaa", "--out", out).exit_code == 0
    good = (folder / "report.html").read_bytes()
    _corrupt(folder, "decode.csv", "truncate")
    assert cli("report", "aaaaaaa", "--out", out).exit_code == 2
    assert (folder / "report.html").read_bytes() == good
