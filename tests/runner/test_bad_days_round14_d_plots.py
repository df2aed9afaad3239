"""Bad days, red-team round 14 part B, R7 (/tmp/rt14b/report.md B9, B10): report.html drew one parity
bar per row of every parity table and one line (and legend entry) per configuration of a timing
table, unbounded: 5 000 parity rows took 92 s / 1.6 GB, 6 000 series 84 s. Checked by what is drawn,
not by a clock: the plots draw at most PLOT_MAX_BARS rows per table (the worst, a FAIL among them)
and PLOT_MAX_SERIES lines per panel, and say so next to the plot; the tables keep a FAIL past their
row cap. Through the CLI (the typer app, in process) on fabricated run folders."""

from __future__ import annotations

import re

import matplotlib.axes
from typer.testing import CliRunner

from nsa_runner import report as rp
from nsa_runner.cli import app

try:  # tests/ is on sys.path under pytest's default (prepend) import mode
    from _runfolders import make_run
except ImportError:  # pragma: no cover - run as a package
    from tests._runfolders import make_run

HEAD = "impl,case,B,T,HQ,G,dk,dv,dtype,max_abs,rel_err,tol,status,note\n"


def _cli(*args):
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.output
    return r


def _notes(html: str) -> list[str]:
    return re.findall(r'<p class="note">([^<]*)</p>', html)


def test_parity_plot_and_table_are_capped_a_fail_kept(tmp_path, monkeypatch):
    run = make_run(tmp_path / "runs", "aaaaaaa", device="cpu")
    rows = "".join(f"nsa_core,c{i},1,128,4,2,32,32,fp32,1e-7,{1e-7 * (1 + i % 7)},1e-3,"
                   f"{'FAIL,wrong' if i == 450 else 'PASS,'}\n" for i in range(500))
    (run / "triton_fwd.csv").write_text(HEAD + rows)
    labels: list[list[str]] = []
    original = matplotlib.axes.Axes.set_yticklabels

    def record(self, ticklabels, *a, **k):
        labels.append([str(t) for t in ticklabels])
        return original(self, ticklabels, *a, **k)

    monkeypatch.setattr(matplotlib.axes.Axes, "set_yticklabels", record)
    r = _cli("report", run)
    assert r.exit_code == 0, r.output
    fwd = next(x for x in labels if "c0" in x or "c450" in x)
    assert len(fwd) == rp.PLOT_MAX_BARS and "c450" in fwd  # 500 bars before, the FAIL among the worst
    html = (run / "report.html").read_text()
    notes = _notes(html)
    assert any(f"the {rp.PLOT_MAX_BARS} worst of 500 rows drawn" in n and "1 failing" in n for n in notes), notes
    # the table: 400 rows at most, the FAIL past row 400 among them, the rest counted
    table = html.split("triton_fwd.csv: 499 passed, 1 failed")[1].split("</table>")[0]
    assert "<td>c450</td>" in table and table.count("<tr class=") == rp.TABLE_MAX_ROWS
    assert any(f"{rp.TABLE_MAX_ROWS} of 500 rows shown" in n and "100 more rows in triton_fwd.csv" in n
               for n in notes), notes


def test_timing_plot_draws_a_bounded_number_of_series(tmp_path, monkeypatch):
    run = make_run(tmp_path / "runs", "aaaaaaa", device="cpu")
    (run / "bench_many.csv").write_text("impl,T,ms\n" + "".join(f"i{i:03d},{t},{0.1 + i * 0.001}\n"
                                                                for i in range(50) for t in (128, 256)))
    entries: list[int] = []
    original = matplotlib.axes.Axes.legend

    def record(self, *a, **k):
        entries.append(len(self.get_legend_handles_labels()[1]))
        return original(self, *a, **k)

    monkeypatch.setattr(matplotlib.axes.Axes, "legend", record)
    r = _cli("report", run)
    assert r.exit_code == 0, r.output
    assert entries and max(entries) <= rp.PLOT_MAX_SERIES  # 50 lines and legend entries before
    notes = _notes((run / "report.html").read_text())
    assert any(f"bench_many plot: the first {rp.PLOT_MAX_SERIES} of 50 configurations (impl) drawn" in n
               for n in notes), notes
