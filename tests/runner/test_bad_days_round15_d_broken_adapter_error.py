"""Bad days, red-team round 15 (part B), helper d, B-R6: a broken adapter's import error was never clipped.

``ImplEntry.error`` (from the import check in a child, or the import in the stage's process) was kept whole and
the stages wrote it into every case row: a 20 MB ``RuntimeError`` made triton_fwd.csv 84 MB (``report`` /
``compare`` then refused the CSV for good) and sanity's result too large to record (nsa_core's passing checks
unrecorded). Now discovery records it as one plain line, clipped (the traceback keeps the rest).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

try:
    from _bad_days import PINNED
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import PINNED

MAIN = PINNED.replace("from nsa_runner.cli import app; app(prog_name='nsa-run')",
                      "from nsa_runner.cli import main; sys.argv[0] = 'nsa-run'; main()")

BIG = 600_000  # characters of the adapter's import error (the CSV reader's field limit is 131 072)


def _main(env, *args, timeout=600):
    return subprocess.run([sys.executable, "-c", MAIN, *map(str, args)], env=env, text=True, timeout=timeout,
                          capture_output=True)


def _broken_adapter(site: Path) -> None:
    (site / "tbmod_d.py").write_text(f'raise RuntimeError("E" * {BIG} + "\\n" + "F" * {BIG})\n')
    info = site / "tbd-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tbd\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[nsa_runner.impls]\ntbi = tbmod_d:X\n")


def test_broken_adapter_error_is_clipped_where_discovery_records_it(plugins, tmp_path):
    _broken_adapter(plugins.site)
    env = plugins.env()
    out = tmp_path / "runs"
    r = _main(env, "oneshot", "--only", "sanity,summary", "--impl", "nsa_core,tbi", "--device", "cpu",
              "--out", out)
    assert "Traceback" not in r.stderr and "(unexpected" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]  # tbi broken: sanity FAILs, it is recorded
    run = out / "testrun"
    m = json.loads((run / "manifest.json").read_text())
    assert m["finished"]
    sanity = next(s for s in m["stages"] if s["name"] == "sanity")
    assert sanity["status"] == "FAIL", sanity["reason"][:500]  # not ERROR "too large to record"
    assert "tbi" in sanity["reason"] and "broken adapter" in sanity["reason"], sanity["reason"][:500]
    for f in run.rglob("*"):  # nothing holds the error whole
        if f.is_file():
            assert f.stat().st_size < BIG, (f, f.stat().st_size)
    # the whole run's records hold it clipped: the error named, its size said
    text = (run / "sanity.json").read_text() if (run / "sanity.json").exists() else json.dumps(sanity)
    assert "RuntimeError: EEEE" in text and "characters)" in text
    r = _main(env, "report", run)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
