"""Bad days, text (issue 16): a CSV key with matplotlib mathtext characters (``$\\foo$``) is drawn
as plain text (the report is written, the key shown as written); a stage returning
``StageResult(files="a.txt")`` (one string) is ERROR naming the wrong type, not a list of letters."""

from __future__ import annotations

import csv
import io
import json

from _runfolders import make_run

ODD = r"$\foo$ $x^$ \$ _{"


def _odd_keys(path, column):
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    for r in rows:
        r[column] = r.get(column, "") + ODD
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    path.write_text(buf.getvalue())


def test_mathtext_in_a_csv_key_is_plotted_as_plain_text(cli, tmp_path):
    out = tmp_path / "runs"
    folder = make_run(out, "aaaaaaa", device="cpu")
    _odd_keys(folder / "triton_fwd.csv", "case")
    _odd_keys(folder / "fa2_bench.csv", "path")
    r = cli("report", "aaaaaaa", "--out", out)
    assert r.exit_code == 0, r.stdout + r.stderr
    html = (folder / "report.html").read_text()
    assert "$\\foo$" in html and html.count("data:image/png;base64,") >= 2


def test_a_single_string_as_files_is_an_error_naming_the_type(plugins, cli, tmp_path):
    plugins.make("str-files", "str_files_mod", """
from nsa_runner import Stage, StageResult, Status

class S(Stage):
    name, order = "strfiles", 30
    def run(self, ctx):
        (ctx.dir / "a.txt").write_text("a")
        return StageResult(Status.PASS, "ok", files="a.txt")
""", {"strfiles": "str_files_mod:S"})
    r = cli("oneshot", "--out", tmp_path / "out", "--only", "strfiles", "--device", "cpu", "--json")
    assert r.exit_code == 1, r.stderr
    (st,) = json.loads(r.stdout)["stages"]
    assert st["status"] == "ERROR" and "files must be a list of strings, got str" in st["reason"], st
    assert "missing" not in st["reason"]  # not "a, ., t, x, t" missing
