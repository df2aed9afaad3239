"""``nsa-run report RUN``: one self-contained ``report.html`` (and ``summary.md`` when absent).

report.html holds everything a reader needs without opening other files: the stage statuses
(a SKIP is grey and says "not run", never green), the machine and versions, the routing, and
plots rendered with matplotlib and embedded as base64 PNGs (decode latency and reads vs S,
kernel / flash times vs T or S, parity errors per case), the selection picture and the stage
figures (selection.png, decode.png) embedded the same way. What is drawn and listed is bounded
(``PLOT_MAX_*``, ``TABLE_MAX_ROWS``: the worst parity rows, the first configurations, failing table
rows first), each cap said next to its plot or table. Inline CSS, no scripts, no external
URL: the file can be mailed or attached to a CI job alone. Relative links to the run's files
work when it is opened inside the run folder.

Files, and what is never clobbered:
- ``report.html`` is derived from the folder and is rewritten (atomically) on every call.
- ``summary.md`` is written by the CLI when a run ends (``nsa_runner.results``). ``report`` writes
  it only when the run has none (a run folder from an older nsa-run), with the same renderer over
  the manifest; an existing ``summary.md`` is left as it is.
- Nothing is written when an artifact is broken (truncated, unknown schema_version, ...):
  ``ArtifactError`` is raised before the first write.
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
import warnings
from pathlib import Path
from typing import Any

from nsa_runner._figures import drawing
from nsa_runner._readers import (
    ArtifactError,
    Run,
    is_reads,
    is_spread,
    is_time,
    key_columns,
    parity_key,
    read_bytes_checked,
    spread_columns,
)
from nsa_runner._text import CONTROL, command_shown
from nsa_runner.artifacts import now_iso, set_aside_copy, unfinished, write_text
from nsa_runner.compare import fmt
from nsa_runner.results import DECODE_FILE, FAILED, PARITY_FILES, REPORT_HTML, SUMMARY_MD, counts, counts_line
from nsa_runner.results import summary as results_summary

REPORT_NAME = REPORT_HTML
SUMMARY_NAME = SUMMARY_MD
STATUS_COLOR = {"PASS": "#1a7f37", "FAIL": "#cf222e", "ERROR": "#82071e", "TIMEOUT": "#bc4c00", "SKIP": "#6e7781"}
STATUS_WORD = {"PASS": "PASS", "FAIL": "FAIL", "ERROR": "ERROR", "TIMEOUT": "TIMEOUT", "SKIP": "SKIP — not run"}
IMAGES = (("selection.png", "Selection picture (selection-map stage)"), ("decode.png", "decode-bench figure"))
# what one report draws, at most (round 14 B R7: one bar per parity row, one line and legend entry per
# configuration, took 92 s / 1.6 GB for 5 000 parity rows, 84 s for 6 000 series); each cap is said
# next to its plot, and the tables below it (or the CSV) hold every row
PLOT_MAX_BARS = 60  # parity bars per table (the worst: failing first, then by rel_err / tol)
PLOT_MAX_PANELS = 6  # parity tables in the parity plot (those with failing rows first)
PLOT_MAX_SERIES = 12  # lines per timing / decode panel (the first configurations by key)
PLOT_MAX_POINTS = 200  # points per line (evenly spaced along x)
PLOT_MAX_FIGURES = 12  # timing figures per report (one per table, in the report's order)
TABLE_MAX_ROWS = 400  # rows per HTML table (failing rows first); the rest are named, never silently dropped

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1180px;
color:#1f2328;line-height:1.4}
h1{font-size:24px;margin:0 0 4px} h2{font-size:19px;border-bottom:1px solid #d0d7de;padding-bottom:4px;margin-top:30px}
h3{font-size:15px;margin-bottom:4px}
table{border-collapse:collapse;margin:8px 0;font-size:13px} th,td{border:1px solid #d0d7de;padding:3px 8px;
text-align:left;vertical-align:top} th{background:#f6f8fa} td.num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:700;font-size:12px;color:#fff;
white-space:nowrap}
.PASS{background:#1a7f37} .FAIL{background:#cf222e} .ERROR{background:#82071e} .TIMEOUT{background:#bc4c00}
.SKIP{background:#fff;color:#57606a;border:1px dashed #6e7781}
.banner{padding:10px 14px;border-radius:6px;font-size:17px;font-weight:700;margin:12px 0}
.banner.ok{background:#dafbe1;border:1px solid #1a7f37} .banner.bad{background:#ffebe9;border:1px solid #cf222e}
.banner.partial{background:#fff8c5;border:1px solid #9a6700}
.absent{color:#57606a;font-style:italic} .note{color:#57606a;font-size:13px}
pre{background:#f6f8fa;padding:8px;overflow-x:auto;font-size:12px;max-height:420px}
img{max-width:100%;border:1px solid #d0d7de} details{margin:4px 0} .scroll{overflow-x:auto;max-width:100%}
tr.row-FAIL td,tr.row-ERROR td,tr.row-TIMEOUT td{background:#fff5f5} tr.row-SKIP td{color:#57606a}
"""


# ---------------------------------------------------------------------------------------------
# plots (matplotlib, no pyplot: no global state, no display)


def _png(fig) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    _plain_log_ticks(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _plain_log_ticks(fig) -> None:
    """Log-scale tick labels as plain numbers. The report draws every text with ``text.parse_math`` off (a label
    from data is drawn as written), and matplotlib's log formatters write mathtext (``$\\mathdefault{10^{2}}$``):
    every log axis of report.html showed that raw, unreadable. A formatter the plot chose itself is kept."""
    from matplotlib.ticker import FuncFormatter, LogFormatter, LogFormatterMathtext

    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            base = getattr(axis.get_transform(), "base", None)
            if base is None:
                continue
            if isinstance(axis.get_major_formatter(), LogFormatterMathtext):  # base 2 (lengths S, T): 16384, not 2e+04
                axis.set_major_formatter(FuncFormatter(_whole) if base == 2 else LogFormatter(base=base))
            if isinstance(axis.get_minor_formatter(), LogFormatterMathtext):
                axis.set_minor_formatter(LogFormatter(base=base, labelOnlyBase=False))


def _whole(v: float, pos=None) -> str:
    return str(int(v)) if 1 <= v < 1e15 and float(v).is_integer() else f"{v:g}"


def _label(text: str) -> str:
    """A legend label as written: matplotlib silently leaves out labels starting with ``_`` (a CSV
    key ``_impl=x`` or a column ``_x_ms`` lost its line's legend entry); a leading space keeps it."""
    text = str(text)
    return " " + text if text.startswith("_") else text


def _figure(w: float, h: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h))


def plot_decode(df, notes: list[str] | None = None) -> str | None:
    """Decode latency vs S (per branch when the table holds one configuration, else ms_step and
    ms_full per configuration), and KV tokens read per step vs S (full attention reads S). At most
    ``PLOT_MAX_SERIES`` lines per panel and ``PLOT_MAX_POINTS`` points per line: what is left out is
    appended to ``notes``."""
    times = [c for c in df.columns if is_time(c) and df[c].notna().any()]
    reads = [c for c in df.columns if is_reads(c) and df[c].notna().any()]
    if "S" not in df.columns or not (times or reads):
        return None
    keys = [k for k in key_columns(df) if k != "S" and df[k].nunique() > 1]
    df = _first_series(df, keys, "decode plot", notes)
    groups = list(df.groupby(keys, dropna=False)) if keys else [((), df)]
    fig = _figure(11, 4.4)
    axes = fig.subplots(1, 2)
    if len(groups) > 1:
        times = [c for c in ("ms_step", "ms_full") if c in times]
    times, reads = _first_columns(times, "decode plot", notes), _first_columns(reads, "decode plot", notes)
    for name, g in groups:
        g = _thin(g.sort_values("S"), "decode plot", notes)
        name = name if isinstance(name, tuple) else (name,)
        sfx = (" " + " ".join(f"{k}={v}" for k, v in zip(keys, name, strict=True))) if keys else ""
        for c in times:
            axes[0].plot(g["S"], g[c], marker="o", lw=2.2 if c in ("ms_step", "ms_full") else 1.2,
                         ls="--" if c == "ms_full" else "-", label=_label(c + sfx))
    g0 = _thin(groups[0][1].sort_values("S"), "decode plot", notes)
    for c in reads:
        axes[1].plot(g0["S"], g0[c], marker="o", ls="--" if c == "reads_full" else "-", label=_label(c))
    if reads and "reads_full" not in reads:
        axes[1].plot(g0["S"], g0["S"], color="k", ls=":", label="full attention (S)")
    for ax, title, ylabel in ((axes[0], "decode step latency vs S", "ms per step"),
                              (axes[1], "KV tokens read per step vs S", "tokens")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("cached length S")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no columns", ha="center", transform=ax.transAxes)
    if len(groups) > 1:
        label = " ".join(f"{k}={v}" for k, v in zip(keys, groups[0][0] if isinstance(groups[0][0], tuple)
                                                     else (groups[0][0],), strict=True))
        axes[1].set_title(f"KV tokens read per step vs S ({label})")
    return _png(fig)


def plot_times(df, title: str, notes: list[str] | None = None) -> str | None:
    """One panel per time column (the first 3): time vs T (or S), one line per configuration, p20..p80
    bars. At most ``PLOT_MAX_SERIES`` lines per panel and ``PLOT_MAX_POINTS`` points per line: what
    is left out is appended to ``notes``."""
    x = "T" if "T" in df.columns else ("S" if "S" in df.columns else None)
    times = [c for c in df.columns if is_time(c)]
    if x is None or not times:
        return None
    if len(times) > 3 and notes is not None:
        notes.append(f"{title} plot: the first 3 of {len(times)} time columns drawn ({', '.join(times[:3])})")
    keys = [k for k in key_columns(df) if k != x and df[k].nunique() > 1]
    df = _first_series(df, keys, f"{title} plot", notes)
    fig = _figure(5.5 * min(len(times), 3), 4.0)
    axes = fig.subplots(1, min(len(times), 3), squeeze=False)[0]
    for ax, c in zip(axes, times[:3], strict=True):
        groups = list(df.groupby(keys, dropna=False)) if keys else [((), df)]
        spread = spread_columns(df, c)
        for name, g in groups:
            g = g[g[c].notna()].sort_values(x)
            if g.empty:
                continue
            g = _thin(g, f"{title} plot", notes)
            name = name if isinstance(name, tuple) else (name,)
            label = " ".join(f"{k}={v}" for k, v in zip(keys, name, strict=True)) or c
            if spread is not None:
                lo = (g[c] - g[spread[0]]).clip(lower=0)
                hi = (g[spread[1]] - g[c]).clip(lower=0)
                ax.errorbar(g[x], g[c], yerr=[lo, hi], marker="o", capsize=2, label=_label(label))
            else:
                ax.plot(g[x], g[c], marker="o", label=_label(label))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(x)
        ax.set_ylabel(f"{c} (ms)")
        ax.set_title(f"{title}: {c}")
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines or ax.containers:
            ax.legend(fontsize=7)
    return _png(fig)


def plot_parity(panels: list[tuple[str, list[dict]]], notes: list[str] | None = None) -> str | None:
    """Horizontal bars of rel_err per case (log x), the tolerance as a black tick, coloured by status.

    ``panels``: (title, [{"case", "status", "rel_err", "tol"}]). A SKIP case gets no bar: its row
    says "SKIP (not run)" in grey, so a missing measurement never looks like a small error. At most
    ``PLOT_MAX_PANELS`` panels (those with a failing row first) of ``PLOT_MAX_BARS`` rows each (the
    worst: failing first, then by rel_err / tol), each cap said in the panel's title and in ``notes``.
    """
    panels = _parity_panels([(t, rows) for t, rows in panels if rows], notes)
    if not panels:
        return None
    height = sum(max(1.2, 0.28 * len(r) + 0.9) for _, r in panels)
    fig = _figure(11, height)
    axes = fig.subplots(len(panels), 1, squeeze=False,
                        gridspec_kw={"height_ratios": [max(1, len(r)) for _, r in panels]})[:, 0]
    for ax, (title, rows) in zip(axes, panels, strict=True):
        # drawn within [_PLOT_MIN, _PLOT_MAX]: a hand-edited rel_err of 1e308 put the log axis's limits
        # (with their margins) beyond a float, and matplotlib printed "RuntimeWarning: overflow" on stderr
        vals = [_drawn(r["rel_err"]) for r in rows if _pos(r["rel_err"])] + [_drawn(r["tol"]) for r in rows
                                                                              if _pos(r["tol"])]
        floor = max(min(vals) / 10, _PLOT_MIN) if vals else 1e-12
        for i, r in enumerate(rows):
            color = STATUS_COLOR.get(r["status"], "#6e7781")
            if _pos(r["rel_err"]) or r["rel_err"] == 0:
                ax.barh(i, max(_drawn(r["rel_err"]), floor) - floor, left=floor, color=color, height=0.6)
                if float(r["rel_err"]) > _PLOT_MAX:
                    ax.text(_PLOT_MAX, i, f" {float(r['rel_err']):.3g} (bar cut at {_PLOT_MAX:g})", va="center",
                            fontsize=8, color=color, style="italic")
            else:
                word = "SKIP (not run)" if r["status"] == "SKIP" else f"{r['status']} (no finite error)"
                ax.text(floor * 1.2, i, word, va="center", fontsize=8, color=color, style="italic")
            if _pos(r["tol"]):
                ax.plot([_drawn(r["tol"])] * 2, [i - 0.4, i + 0.4], color="k", lw=2)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([r["case"] for r in rows], fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlim(left=floor)
        ax.set_xlabel("relative error vs float64 reference (black tick: tolerance)")
        ax.set_title(title)
        ax.grid(True, axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def _badness(r: dict) -> tuple[int, float]:
    """How bad a parity row is, for choosing what the plot draws: failing first, then by rel_err / tol
    (rel_err alone without a tolerance); a row without a finite error last."""
    failed = 0 if r.get("status") in FAILED else 1
    try:
        err, tol = float(r.get("rel_err")), float(r.get("tol"))
    except (TypeError, ValueError):
        return failed, math.inf
    if not math.isfinite(err):
        return failed, math.inf
    return failed, -(err / tol if math.isfinite(tol) and tol > 0 else err)


def _worst(rows: list[dict], n: int) -> list[dict]:
    """The ``n`` worst rows (``_badness``), in the table's order."""
    if len(rows) <= n:
        return rows
    keep = sorted(sorted(range(len(rows)), key=lambda i: _badness(rows[i]))[:n])
    return [rows[i] for i in keep]


def _parity_panels(panels: list[tuple[str, list[dict]]], notes: list[str] | None) -> list[tuple[str, list[dict]]]:
    """The panels and rows ``plot_parity`` draws (``PLOT_MAX_PANELS``, ``PLOT_MAX_BARS``), the caps said."""
    if len(panels) > PLOT_MAX_PANELS:
        order = sorted(range(len(panels)), key=lambda i: (not any(r.get("status") in FAILED for r in panels[i][1]), i))
        keep = sorted(order[:PLOT_MAX_PANELS])
        left = [panels[i][0] for i in order[PLOT_MAX_PANELS:]]
        _note(notes, f"parity plot: {PLOT_MAX_PANELS} of {len(panels)} tables drawn (those with a failing row "
                     f"first); not drawn: {', '.join(map(str, left[:5]))}" + (" ..." if len(left) > 5 else ""))
        panels = [panels[i] for i in keep]
    out = []
    for title, rows in panels:
        if len(rows) > PLOT_MAX_BARS:
            kept = _worst(rows, PLOT_MAX_BARS)
            bad = sum(r.get("status") in FAILED for r in rows)
            _note(notes, f"parity plot, {title}: the {len(kept)} worst of {len(rows)} rows drawn (failing first "
                         f"— {bad} failing — then by rel_err / tol); every row is in its table below and the file")
            title = f"{title} — the {len(kept)} worst of {len(rows)} rows"
            rows = kept
        out.append((title, rows))
    return out


def _note(notes: list[str] | None, line: str) -> None:
    if notes is not None and line not in notes:
        notes.append(line)


def _first_series(df, keys: list[str], what: str, notes: list[str] | None):
    """``df`` with the rows of its first ``PLOT_MAX_SERIES`` configurations (groups of ``keys``, in key
    order), the cap noted: one line and one legend entry per configuration was unbounded."""
    if not keys:
        return df
    gid = df.groupby(keys, dropna=False, sort=True).ngroup()
    total = int(gid.max()) + 1 if len(gid) else 0
    if total <= PLOT_MAX_SERIES:
        return df
    _note(notes, f"{what}: the first {PLOT_MAX_SERIES} of {total} configurations ({', '.join(map(str, keys))}) "
                 "drawn; every row is in the table below and the file")
    return df[gid < PLOT_MAX_SERIES]


def _first_columns(cols: list[str], what: str, notes: list[str] | None) -> list[str]:
    if len(cols) <= PLOT_MAX_SERIES:
        return cols
    _note(notes, f"{what}: the first {PLOT_MAX_SERIES} of {len(cols)} columns drawn")
    return cols[:PLOT_MAX_SERIES]


def _thin(g, what: str, notes: list[str] | None):
    """At most ``PLOT_MAX_POINTS`` rows of one line (sorted along x), evenly spaced, the first and the
    last kept; the thinning noted."""
    n = len(g)
    if n <= PLOT_MAX_POINTS:
        return g
    step = (n - 1) / (PLOT_MAX_POINTS - 1)
    idx = sorted({round(i * step) for i in range(PLOT_MAX_POINTS)})
    _note(notes, f"{what}: lines of more than {PLOT_MAX_POINTS} points drawn with {PLOT_MAX_POINTS}, evenly "
                 "spaced along x; every row is in the table below and the file")
    return g.iloc[idx]


_PLOT_MIN, _PLOT_MAX = 1e-200, 1e100  # a log axis of errors, with room for its margins within a float


def _drawn(v: Any) -> float:
    """A positive error or tolerance as drawn: within [_PLOT_MIN, _PLOT_MAX] (tables show the value)."""
    return min(max(float(v), _PLOT_MIN), _PLOT_MAX)


def _pos(v: Any) -> bool:
    try:
        return math.isfinite(float(v)) and float(v) > 0
    except (TypeError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------
# html pieces


# escape sequences and control characters (a log tail's colours, a stray BEL or NUL, C1 CSI, DEL): never
# meaningful in a page and not allowed in HTML text, so they are removed before escaping; so are the Unicode
# bidi controls: one rule with the terminal, summary.md and junit.xml (``_text.CONTROL``; round 17 B-1).
_CONTROL = CONTROL


def _e(v: Any) -> str:
    return html.escape(_CONTROL.sub("", "" if v is None else str(v)), quote=True)


def _file_link(path: Any, text: str | None = None) -> str:
    """A link to a file of the run folder (``results.summary.link_target``: always a relative URL, ``javascript:x``
    is a file name here); a name leading out of the folder is shown as text only."""
    target = results_summary.link_target(path)
    if target is None:
        return _e(path if text is None else f"{text} {path}")
    return f'<a href="{_e(target)}">{_e(path if text is None else text)}</a>'


def _recorded_link(run: Run, stage: str, name: Any, text: str | None = None) -> str:
    """``_file_link`` to what the manifest records for a stage's file: while a rerun has the stage's files set aside
    in history/, their set-aside copy (round 34 B34-5: the link led to the dead attempt's file in place)."""
    aside = set_aside_copy(run.manifest, stage, str(name), run.dir)
    if aside is None:
        return _file_link(name, text)
    if not aside:
        return _e(f"{text or name} (not in this run while its stage is rerun)")
    return _file_link(aside, f"{text or name} (set aside)")


def badge(status: str) -> str:
    s = status if status in STATUS_WORD else "ERROR"
    return f'<span class="badge {s}">{_e(STATUS_WORD[s])}</span>'


def _img(b64: str, alt: str) -> str:
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{b64}">'


def _table(rows: list[dict], cols: list[str], status_col: str | None = None, max_rows: int = TABLE_MAX_ROWS,
           where: str = "the CSV") -> str:
    """An HTML table of at most ``max_rows`` rows: with a status column, the failing rows first (a FAIL
    past the cap was only "N more rows in the CSV"), in the table's order; the rows left out are
    counted under it, with how many of them fail."""
    shown_rows = rows
    if len(rows) > max_rows:
        if status_col:
            bad = [i for i, r in enumerate(rows) if str(r.get(status_col)) in FAILED][:max_rows]
            rest = [i for i, r in enumerate(rows) if str(r.get(status_col)) not in FAILED][:max_rows - len(bad)]
            shown_rows = [rows[i] for i in sorted(bad + rest)]
        else:
            shown_rows = rows[:max_rows]
    out = ['<div class="scroll"><table><tr>' + "".join(f"<th>{_e(c)}</th>" for c in cols) + "</tr>"]
    for r in shown_rows:
        st = str(r.get(status_col, "")) if status_col else ""
        cells = []
        for c in cols:
            v = r.get(c)
            if c == status_col:
                cells.append(f"<td>{badge(str(v))}</td>")
            elif isinstance(v, float):
                cells.append(f'<td class="num">{_e(fmt(v, c))}</td>')
            elif isinstance(v, int) and not isinstance(v, bool):
                cells.append(f'<td class="num">{v}</td>')
            else:
                cells.append(f"<td>{_e('' if v is None or (isinstance(v, float) and math.isnan(v)) else v)}</td>")
        out.append(f'<tr class="row-{_e(st)}">' + "".join(cells) + "</tr>")
    out.append("</table></div>")
    if len(rows) > max_rows:
        left = len(rows) - len(shown_rows)
        failing = (sum(str(r.get(status_col)) in FAILED for r in rows)
                   - sum(str(r.get(status_col)) in FAILED for r in shown_rows)) if status_col else 0
        which = (f"the failing ones first; {failing} of those not shown fail" if status_col
                 else f"the first {len(shown_rows)}")
        out.append(f'<p class="note">{len(shown_rows)} of {len(rows)} rows shown ({which}): {left} more rows in '
                   f"{_e(where)}.</p>")
    return "\n".join(out)


def _absent(what: str) -> str:
    return f'<p class="absent">{_e(what)}: not in this run.</p>'


def _banner(m: dict, c: dict) -> str:
    line = counts_line(c)
    skipped = [s["name"] for s in m["stages"] if s["status"] == "SKIP"]
    if c["failed"]:
        cls, word = "bad", "FAILED"
    elif skipped:
        cls, word = "partial", "NO FAILURE, BUT NOT EVERYTHING RAN"
    elif c["passed"]:
        cls, word = "ok", "PASSED"
    else:
        cls, word = "partial", "NOTHING RAN"
    died = unfinished(m)
    if died and not c["failed"]:
        cls, word = "bad", "UNFINISHED"
    extra = f'<div class="note">{_e(died)}</div>' if died else ""
    if skipped:  # added to the note on an unfinished run, never in its place
        extra += f'<div class="note">skipped (not validated on this run): {_e(", ".join(skipped))}</div>'
    if m.get("interrupted"):
        extra += f'<div class="note">the run was interrupted {_e(results_summary.interrupted_line(m))}</div>'
    return f'<div class="banner {cls}">{word}: {_e(line)}{extra}</div>'


def _stages_html(run: Run) -> str:
    rows = []
    for s in run.stages:
        reason = s.get("reason", "")
        if s["status"] == "SKIP" and s.get("hint"):
            reason += f" (fix: {s['hint']})"
        files = " ".join(_recorded_link(run, s["name"], f) for f in s.get("files") or [])
        log = f" {_recorded_link(run, s['name'], s['log'], 'log')}" if s.get("log") else ""
        rows.append(f'<tr class="row-{_e(s["status"])}"><td class="num">{_e(s.get("order", ""))}</td>'
                    f'<td><b>{_e(s["name"])}</b></td><td>{badge(s["status"])}</td>'
                    f'<td class="num">{float(s.get("duration_s") or 0):.1f}s</td><td>{_e(reason)}</td>'
                    f"<td>{files}{log}</td></tr>")
    out = ["<table><tr><th>#</th><th>stage</th><th>status</th><th>time</th><th>reason</th><th>files</th></tr>",
           *rows, "</table>"]
    for s in run.stages:
        detail = s.get("traceback") or s.get("log_tail")
        if s["status"] in FAILED and detail:
            out.append(f"<details open><summary><b>{_e(s['name'])}</b>: {_e(s['status'])} — log tail</summary>"
                       f"<pre>{_e(detail[-6000:])}</pre></details>")
    return "\n".join(out)


def _facts_html(run: Run) -> str:
    m = run.manifest
    mach = run.machine()
    host = m.get("host") or {}
    facts = [("run id", run.run_id), ("machine", mach["label"]), ("device", m.get("device")),
             ("profile", m.get("profile")), ("host", f"{host.get('hostname', '?')} ({host.get('platform', '?')})"),
             ("started", m.get("started")), ("finished", m.get("finished")),
             ("command", command_shown(m.get("argv")))]
    facts += [("then", c) for c in results_summary.later_commands(m)]
    facts += list(run.versions().items())
    routing = run.json("routing.json")
    if routing is not None:
        for br, v in (routing.get("branches") or {}).items():
            if isinstance(v, dict):
                facts.append((f"routing {br}", f"{v.get('backend', '?')} — {v.get('reason', '')}"))
    facts += _thresholds_facts(run, routing)
    return "<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts) + "</table>"


def _min_lens(entry: dict | None) -> str:
    """``cmp: varlen from S=16384, ...; win: ...`` of one thresholds entry."""
    if not isinstance(entry, dict):
        return ""
    parts = []
    for br, paths in (entry.get("branches") or {}).items():
        if isinstance(paths, dict):
            best = sorted((v.get("min_len"), p) for p, v in paths.items()
                          if isinstance(v, dict) and isinstance(v.get("min_len"), int))
            parts.append(f"{br}: " + (", ".join(f"{p} from S={n}" for n, p in best) or "no flash path wins"))
    where = " ".join(str(entry.get(k)) for k in ("gpu", "torch") if entry.get(k))
    return (f"{where} — " if where else "") + "; ".join(parts)


def _thresholds_facts(run: Run, routing: dict | None) -> list[tuple[str, str]]:
    """The routing thresholds this run used and the ones it measured (both kept in the run folder)."""
    out = []
    used = (routing or {}).get("thresholds") if isinstance(routing, dict) else None
    if isinstance(used, dict):
        text = f"{used.get('source', '?')}: {used.get('note', '')}"
        if used.get("entry"):
            text += f" — {_min_lens(used['entry'])}"
        out.append(("routing thresholds used", text))
    env = run.env or {}
    thr = env.get("routing_thresholds") if isinstance(env, dict) else None
    if isinstance(thr, dict) and thr.get("file"):
        kept = (f"; a copy as it was at the start of the run: {thr['copy']}" if thr.get("copy")
                else f" ({thr.get('note')})")
        out.append(("routing thresholds file", f"{thr['file']}{kept}"))
    measured = run.json("fa2_thresholds.json") if "fa2_thresholds.json" in _declared(run) else None
    if measured is not None:
        entries = measured.get("entries") or []
        out.append(("routing thresholds measured", _min_lens(entries[-1] if entries else None)
                    + " (fa2_thresholds.json)"))
    else:
        fa2 = run.stage("fa2-probe")
        why = f"fa2-probe {fa2['status']}: {fa2.get('reason', '')}" if fa2 else "fa2-probe did not run"
        out.append(("routing thresholds measured", f"not measured in this run ({why})"))
    return out


def _declared(run: Run) -> set[str]:
    return {f for s in run.stages for f in (s.get("files") or [])}


def _side_by_side(name: str, recs: list[dict], impls: list[str]) -> str:
    """One row per case, per implementation its status and rel_err (a SKIP's reason in the note)."""
    by_case: dict[str, dict] = {}
    for r in recs:
        row = by_case.setdefault(str(r["case"]), {"case": r["case"], "tol": r.get("tol")})
        impl = parity_key(r)[0]  # an empty impl is nsa_core's, as compare and the reader take it
        row[f"{impl} status"] = r["status"]
        row[f"{impl} rel_err"] = r.get("rel_err")
        if r["status"] != "PASS" and isinstance(r.get("note"), str) and r["note"]:
            row["note"] = "; ".join(filter(None, [row.get("note"), r["note"]]))
        if isinstance(r.get("tol"), float) and not math.isnan(r["tol"]):
            row["tol"] = r["tol"]
    cols = ["case"] + [f"{i} {w}" for i in impls for w in ("status", "rel_err")] + ["tol", "note"]
    body = _table(list(by_case.values()), cols)
    for st in ("PASS", "FAIL", "SKIP", "ERROR", "TIMEOUT"):  # status cells as badges
        body = body.replace(f"<td>{st}</td>", f"<td>{badge(st)}</td>")
    return f"<h3>{_e(name)}: implementations side by side ({_e(', '.join(impls))})</h3>" + body


def _parity_html(run: Run) -> str:
    panels, tables = [], []
    for name in run.parity_files() or PARITY_FILES:
        df = run.parity(name)
        if df is None:
            tables.append(_absent(name))
            continue
        recs = df.to_dict("records")
        impls = list(dict.fromkeys(parity_key(r)[0] for r in recs)) if "impl" in df.columns else []
        many = len(impls) > 1
        panels.append((name, [{"case": f"{parity_key(r)[0]}: {r['case']}" if many else r["case"], "status": r["status"],
                               "rel_err": r["rel_err"], "tol": r["tol"]} for r in recs]))
        if many:
            tables.append(_side_by_side(name, recs, impls))
        cols = [c for c in ("impl", "case", "status", "dtype", "max_abs", "rel_err", "tol", "worst", "rel_dq", "rel_dk",
                            "rel_dv", "note") if c in df.columns]
        bad = sum(r["status"] in FAILED for r in recs)
        skip = sum(r["status"] == "SKIP" for r in recs)
        tables.append(f"<h3>{_e(name)}: {len(recs) - bad - skip} passed, {bad} failed, {skip} skipped "
                      f"(not run)</h3>" + _table(recs, cols, "status", where=name))
    checks = run.sanity_checks()  # validated: "ok" true/false, rel_err / tol numbers (shared with compare)
    if checks is not None:
        errs = [{"case": c["check"], "status": c["status"], "rel_err": c["rel_err"], "tol": c["tol"]}
                for c in checks if c["has_err"]]
        panels.append(("sanity.json (branches vs float64 reference)", errs))
        failing = [{"check": c["check"], "status": c["status"], "detail": c["detail"]} for c in checks]
        nbad = sum(r["status"] == "FAIL" for r in failing)
        tables.append(f"<h3>sanity.json: {len(failing) - nbad} of {len(failing)} checks hold</h3>"
                      + _table(failing, ["check", "status", "detail"], "status", where="sanity.json"))
    else:
        tables.append(_absent("sanity.json"))
    notes: list[str] = []
    png = plot_parity(panels, notes)
    head = (_img(png, "parity errors per case") + _plot_notes(notes)) if png else _absent("parity errors")
    return head + "\n" + "\n".join(tables)


def _plot_notes(notes: list[str]) -> str:
    """What a plot left out (its caps), said right under it."""
    return "".join(f'<p class="note">{_e(n)}</p>' for n in notes)


def _decode_html(run: Run) -> str:
    df = run.timing(DECODE_FILE) if DECODE_FILE in run.timing_files() else None
    if df is None:
        return _absent(DECODE_FILE)
    notes: list[str] = []
    png = plot_decode(df, notes)
    keys = [k for k in key_columns(df) if df[k].nunique() > 1 or k in ("S", "B")]
    cols = keys + [c for c in df.columns if (is_time(c) or is_reads(c) or c.startswith("speedup"))
                   and df[c].notna().any() and c not in keys]
    more = len(df.columns) - len(cols)
    note = f'<p class="note">{more} more columns in <a href="{DECODE_FILE}">{DECODE_FILE}</a>.</p>' if more else ""
    return ((_img(png, "decode latency and reads vs S") + _plot_notes(notes) if png else "")
            + _table(df.to_dict("records"), cols, where=DECODE_FILE) + note)


def _bench_html(run: Run) -> str:
    out = []
    names = sorted((n for n in run.timing_files() if n != DECODE_FILE), key=lambda n: n == "fa2_bench.csv")
    drawn = 0
    for name in names:
        df = run.timing(name)
        if df is None:
            continue
        owner = run.declared_by(name)
        title = "flash / SDPA" if name == "fa2_bench.csv" else name.removesuffix(".csv")
        notes: list[str] = []
        if drawn < PLOT_MAX_FIGURES:
            png = plot_times(df, title, notes)
            drawn += png is not None
        else:
            png, notes = None, [f"{name}: not plotted (the report draws {PLOT_MAX_FIGURES} timing figures at most)"]
        cols = [c for c in df.columns if not is_spread(c)]
        head = f"{name} ({owner})" if owner else name
        out.append(f"<h3>{_e(head)}</h3>" + (_img(png, f"{name} times") if png else "") + _plot_notes(notes)
                   + _table(df.to_dict("records"), cols, where=name))
    return "\n".join(out) if out else _absent("benchmark CSVs (prefill.csv, fa2_bench.csv, plugin tables, bench_*.csv)")


def _images_html(run: Run) -> str:
    out = []
    declared = run.images()
    shown = {n for n, _ in declared}
    titles = dict(IMAGES)  # the built-ins' figures keep their own titles
    images = [(n, titles.get(n, f"{n} ({stage} stage)")) for n, stage in declared]
    images += [(n, t) for n, t in IMAGES if n not in shown]  # the built-ins' pictures, said absent
    for name, title in images:
        p = run.recorded(name)  # a declared name outside the run folder is named, never read; one a rerun set
        if p is None or not p.is_file():  # aside: its recorded copy in history/
            out.append(_absent(f"{name} ({title})"))
            continue
        data = read_bytes_checked(p)  # refused by type and size before reading
        if not data.startswith(b"\x89PNG\r\n\x1a\n"):
            raise ArtifactError(f"{p}: not a PNG file (truncated or corrupt)")
        out.append(f"<h3>{_e(title)}</h3>" + _img(base64.b64encode(data).decode("ascii"), title))
    sel = run.jsonl("sel_ranges.jsonl")
    if sel is not None:
        out.append(f'<p class="note">sel_ranges.jsonl: {len(sel)} sampled (t, group) rows.</p>')
    return "\n".join(out)


def _env_html(run: Run) -> str:
    p = run.inside("env.txt")
    if not p.is_file():
        return _absent("env.txt")
    text = read_bytes_checked(p).decode("utf-8", errors="replace")  # refused by type and size first
    return f"<details><summary>env.txt</summary><pre>{_e(text)}</pre></details>"


def render(run: Run) -> str:
    """The report.html text for a run folder. Raises ArtifactError on a broken artifact.

    Plot labels are plain text: a CSV key such as ``$\\foo$`` is drawn as written, never parsed
    as matplotlib mathtext (which raises on unknown symbols). Drawn under matplotlib's own settings
    (``_figures.drawing``), whatever the process's rcParams are."""
    # matplotlib's UserWarnings (no positive values for a log scale, no labelled lines) are about
    # the data: the report shows the data; a source line of report.py on the terminal helps nobody
    with drawing({"text.parse_math": False}), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return _render(run)


# what a hand-broken artifact the readers' checks do not cover raises inside one section's tables or plots
_SECTION_ERRORS = (TypeError, ValueError, KeyError, AttributeError, IndexError, ZeroDivisionError, OverflowError)


def _section(run: Run, title: str, make) -> str:
    """One section of the report; an artifact it cannot use (a shape the readers do not check, a
    column of infinities a log-scaled plot cannot draw) leaves that section out, saying so and naming
    the files it read, and is noted in ``run.problems``: the rest of the report is still written.
    ArtifactError (a broken file the readers name) still stops the report."""
    touched = run._cache.setdefault("_touched", [])
    start = len(touched)
    try:
        return make(run)
    except ArtifactError:
        raise
    except _SECTION_ERRORS as e:
        files = list(dict.fromkeys(reversed(touched[start:])))  # the file read last first: the likely culprit
        what = " ".join(f"{type(e).__name__}: {e}".split())[:200]
        line = f"{title}: not shown: {files[0] if files else 'the manifest'} cannot be used ({what})"
        if len(files) > 1:
            line += f"; the section also read {', '.join(files[1:])}"
        run._cache.setdefault("_problems", []).append(line)
        return f'<p class="absent">{_e(line)}</p>'


def _render(run: Run) -> str:
    m = run.manifest
    c = counts(m["stages"])
    sections = [("Stages", _stages_html), ("Machine", _facts_html),
                ("Parity (errors vs float64 reference)", _parity_html), ("Decode (decode-bench)", _decode_html),
                ("Kernel benchmarks", _bench_html), ("Figures", _images_html), ("Environment", _env_html)]
    body = [
        f"<h1>nsa-run report — {_e(run.run_id)}</h1>",
        f'<div class="note">{_e(run.machine()["label"])} · profile {_e(m.get("profile"))} · '
        f"started {_e(m.get('started'))} · report written {_e(now_iso())}</div>",
        _banner(m, c),
    ]
    for title, make in sections:
        body += [f"<h2>{_e(title)}</h2>", _section(run, title, make)]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>nsa-run {_e(run.run_id)}</title><style>{CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def summary_markdown(run: Run) -> str:
    """summary.md as the runner writes it at the end of a run (``nsa_runner.results.summary``)."""
    return results_summary.markdown(run.manifest)


def prepare(folder: Path) -> dict:
    """Render report.html (and summary.md when the folder has none) in memory; nothing is written.
    A broken artifact raises ArtifactError. ``commit`` writes what this returns."""
    run = Run.open(folder)
    text = render(run)
    summary_path = run.dir / SUMMARY_NAME
    # a link / folder there is not written through (``nsa-run report`` names it)
    summary_text = None if os.path.lexists(summary_path) else summary_markdown(run)
    return {"run": run, "html": text, "summary_text": summary_text}


def commit(prepared: dict, written: list[str] | None = None) -> dict:
    """Write what ``prepare`` rendered: report.html, then summary.md when it had none. Each name
    is appended to ``written`` once written (an OSError part-way leaves the list true)."""
    written = [] if written is None else written
    run = prepared["run"]
    summary_path = run.dir / SUMMARY_NAME
    summary_text = prepared["summary_text"]
    report_path = write_text(run.dir / REPORT_NAME, prepared["html"])
    written.append(REPORT_NAME)
    if summary_text is not None:
        write_text(summary_path, summary_text)
        written.append(SUMMARY_NAME)
    return {"report": str(report_path), "summary": str(summary_path), "summary_written": summary_text is not None,
            "run_id": run.run_id, "counts": counts(run.stages),
            "unfinished": unfinished(run.manifest), "running": run.running(),
            "interrupted": bool(run.manifest.get("interrupted")),
            "interrupted_line": results_summary.interrupted_line(run.manifest),
            "problems": list(run._cache.get("_problems", []))}


def write(folder: Path) -> dict:
    """Write report.html (and summary.md when absent) into the run folder.

    Returns ``{"report": path, "summary": path, "summary_written": bool, "counts": {...}}``.
    Everything is rendered before the first write: a broken artifact raises ArtifactError and
    leaves the folder as it was.
    """
    return commit(prepare(folder))
