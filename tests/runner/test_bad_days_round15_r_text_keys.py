"""Bad days, red-team round 15 part B, B-R4 (/tmp/rt15b/report.md): the tables a run writes were read
back with pandas' own parsing, which takes ``NA`` / ``None`` / ``nan`` / ``null`` / ``TRUE`` / ``1.0`` for
"no value", a boolean or a number. Implementations named ``NA`` (or ``1`` and ``1.0``) beside nsa_core
wrote a correct triton_fwd.csv that was then "case ... of implementation 'nsa_core' appears more than
once": no report.html, and ``report`` / ``compare`` refused the run for good. Root: one shared reader
(``_readers.read_csv``) now reads every cell as the exact text written and types the columns after.

Through the CLI: a real run of implementation plugins of such names beside nsa_core (report.html at the
end of the run, ``report``, ``compare`` naming the implementation that regressed), and fabricated runs
whose parity and timing tables carry such names, a case id with leading spaces among them."""

from __future__ import annotations

import csv
import importlib
import io
import json
import os
import shutil
import sys

import pytest
import torch

if not torch.cuda.is_available():  # before triton is imported (the parity stage runs nsa_core in it)
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:  # tests/ is on sys.path under pytest's default (prepend) import mode
    from _runfolders import make_run
except ImportError:  # pragma: no cover - run as a package
    from tests._runfolders import make_run

# test_impls_cli's correct example kernel (a dense masked SDPA), one Impl per odd name
KERNEL = """
import torch
from nsa_runner.impls import Constraints, Impl

def selection_attention(q, k, v, block_idx, block_count, cfg):
    t = torch.arange(q.shape[1], device=q.device)
    live = torch.arange(block_idx.shape[-1], device=q.device) < block_count[..., None]
    blocks = torch.where(live, block_idx, -1).long()[..., None]
    mask = (blocks == t // cfg.l_sel).any(-2) & (t <= t[:, None, None])
    mask = mask.transpose(1, 2).repeat_interleave(q.shape[2] // k.shape[2], 1)
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return o.transpose(1, 2).nan_to_num()
"""

# valid implementation names (registry.NAME_RE) that pandas read as "no value", a boolean or one number
ODD_IMPLS = ("NA", "None", "nan", "1", "1.0", "TRUE")


def _rows(path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(path.read_text(), newline="")))


def _write_rows(path, rows: list[dict]) -> None:
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    path.write_text(buf.getvalue())


def _as_run(src, dst, run_id: str) -> None:
    shutil.copytree(src, dst)
    m = json.loads((dst / "manifest.json").read_text())
    m["run_id"] = run_id
    (dst / "manifest.json").write_text(json.dumps(m))


@pytest.fixture
def odd_impls(plugins):
    pytest.importorskip("triton", reason="the parity stage needs triton (the interpreter on CPU)")
    source = KERNEL + "".join(
        f"\nIMPL_{i} = Impl({name!r}, {{'selection_attention': selection_attention}}, Constraints(dtypes=('fp32',)))\n"
        for i, name in enumerate(ODD_IMPLS))
    (plugins.site / "odd_names.py").write_text(source)
    info = plugins.site / "odd_names-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: odd-names\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[nsa_runner.impls]\n" + "".join(
        f"{name} = odd_names:IMPL_{i}\n" for i, name in enumerate(ODD_IMPLS)))
    importlib.invalidate_caches()
    sys.modules.pop("odd_names", None)
    return plugins


def test_impls_named_na_none_nan_1_10_true_beside_nsa_core(odd_impls, cli, tmp_path):
    impls = ",".join(("nsa_core", *ODD_IMPLS))
    r = cli("oneshot", "--only", "triton-fwd,summary", "--impl", impls, "--out", tmp_path, "--device", "cpu")
    out = r.stdout + r.stderr
    assert r.exit_code == 0, out
    assert "report not written" not in out and "more than once" not in out
    run = tmp_path / "testrun"
    rows = _rows(run / "triton_fwd.csv")
    assert {row["impl"] for row in rows} == {"nsa_core", *ODD_IMPLS}
    # report.html written at the end of the run, every implementation under the name it was given
    html = (run / "report.html").read_text()
    assert f"implementations side by side ({', '.join(('nsa_core', *ODD_IMPLS))})" in html
    r = cli("report", run)
    assert r.exit_code == 0, r.stdout + r.stderr
    r = cli("compare", run, run, "--json")
    assert r.exit_code == 0, r.stdout + r.stderr
    same = [row for row in json.loads(r.stdout)["rows"] if row["source"] == "triton_fwd.csv"]
    labels = {row["key"] for row in same}
    assert len(same) == len(rows) == len(labels)  # one compared row per written row: none collapsed
    for name in ODD_IMPLS:
        assert any(k.endswith(f" [impl={name}]") for k in labels), (name, labels)
    # B: implementation "NA" newly failing -> a regression of "NA", never nsa_core's (nor "1"'s of "1.0")
    _as_run(run, tmp_path / "b", "b")
    b_rows = _rows(tmp_path / "b" / "triton_fwd.csv")
    for row in b_rows:
        if row["impl"] in ("NA", "1.0") and row["status"] == "PASS":
            row.update(status="FAIL", rel_err="5.0", max_abs="5.0", note="planted")
    _write_rows(tmp_path / "b" / "triton_fwd.csv", b_rows)
    r = cli("compare", run, tmp_path / "b", "--json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 1, r.stdout + r.stderr
    failing = {row["key"] for row in doc["rows"] if row["source"] == "triton_fwd.csv" and row["mark"] == "!"}
    planted = {f"{row['case']} [impl={row['impl']}]" for row in b_rows if row["note"] == "planted"}
    assert planted and failing == planted


HEAD = "impl,case,B,T,HQ,G,dk,dv,dtype,max_abs,rel_err,tol,status,note\n"
OK = "1,128,4,2,32,32,fp32,1e-7,1e-7,1e-3,PASS,\n"
BAD = "1,128,4,2,32,32,fp32,5.0,5.0,1e-3,FAIL,planted\n"
NAMES = ("nsa_core", "NA", "None", "nan", "null", "NULL", "1", "1.0", "TRUE", "  x")
CASES = ("c1", "NA", "  x", "1", "1.0")


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "runs"
    make_run(root, "aaaaaaa")
    _as_run(root / "aaaaaaa", root / "bbbbbbb", "bbbbbbb")
    for run_id, bad in (("aaaaaaa", None), ("bbbbbbb", ("NA", "  x"))):
        folder = root / run_id
        (folder / "triton_fwd.csv").write_text(HEAD + "".join(
            f'"{impl}","{case}",' + (BAD if (impl, case) == bad else OK) for impl in NAMES for case in CASES))
        # a timing table keyed by impl: None / null were one "no value", 1 / 1.0 one number
        (folder / "decode.csv").write_text("S,B,impl,ms_step,reads_total\n" + "".join(
            f'{S},1,"{impl}",0.5,{100 * (3 if (run_id, impl, S) == ("bbbbbbb", "1.0", 4096) else 1)}\n'
            for S in (1024, 4096) for impl in NAMES))
        # a table whose impl column holds only numbers-looking names
        (folder / "bench_selection.csv").write_text("T,impl,ms\n" + "".join(
            f"{T},{impl},0.4\n" for T in (8192, 16384) for impl in ("1", "1.0", "01")))
    return root


def test_report_keeps_every_name_as_written(runs, cli):
    r = cli("report", runs / "aaaaaaa")
    assert r.exit_code == 0, r.stdout + r.stderr
    html = (runs / "aaaaaaa" / "report.html").read_text()
    assert f"implementations side by side ({', '.join(NAMES)})" in html
    assert "<td>  x</td>" in html and "<td>1.0</td>" in html and "<td>01</td>" in html


def test_compare_pairs_rows_by_the_names_as_written(runs, cli):
    r = cli("compare", "aaaaaaa", "bbbbbbb", "--out", runs, "--json")
    assert r.exit_code == 1, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    par = [row for row in doc["rows"] if row["source"] == "triton_fwd.csv"]
    assert len(par) == len(NAMES) * len(CASES)
    assert [row["key"] for row in par if row["mark"] == "!"] == ["  x [impl=NA]"]
    dec = [row for row in doc["rows"] if row["source"] == "decode.csv" and row["metric"] == "reads_total"]
    assert len(dec) == 2 * len(NAMES)
    assert [row["key"] for row in dec if row["mark"] == "+"] == ["S=4096 impl=1.0"]
    bench = [row for row in doc["rows"] if row["source"] == "bench_selection.csv"]
    assert sorted(row["key"] for row in bench) == sorted(f"T={T} impl={i}" for T in (8192, 16384)
                                                        for i in ("1", "1.0", "01"))
