"""Found while fixing round 23 B23-4 (helper c), through the CLI: report.html draws every text with
``text.parse_math`` off (issue 16: a CSV key ``$\\foo$`` drawn as written), and matplotlib's log-scale formatters
write their tick labels as mathtext (``$\\mathdefault{10^{2}}$``): every log axis of the report (decode latency and
reads vs S, the benchmarks' ms vs T, the parity errors) showed that raw text, unreadable.

Expected: log-scale tick labels are plain numbers (16384, 1e-03); a label from data is still drawn as written.
"""

from __future__ import annotations

try:
    from _runfolders import make_run
except ImportError:  # pragma: no cover - run from the repository root
    from tests._runfolders import make_run


def test_log_tick_labels_of_the_report_are_plain_numbers(cli, tmp_path, monkeypatch):
    from nsa_runner import report

    seen: list[str] = []
    draw = report._png

    def png(fig):  # the figure as the report drew it: its tick labels after the draw
        out = draw(fig)
        for ax in fig.axes:
            for axis in (ax.xaxis, ax.yaxis):
                if axis.get_scale() == "log":
                    seen.extend(t.get_text() for t in axis.get_ticklabels(which="both") if t.get_text())
        return out

    monkeypatch.setattr(report, "_png", png)
    out = tmp_path / "runs"
    folder = make_run(out, "aaaaaaa", device="cpu")
    r = cli("report", "aaaaaaa", "--out", out)
    assert r.exit_code == 0, r.stdout + r.stderr
    assert (folder / "report.html").read_text().count("data:image/png;base64,") >= 3
    assert seen and not [t for t in seen if "$" in t or "mathdefault" in t], seen
    assert "16384" in seen, seen  # a length on a base-2 axis, as a whole number
