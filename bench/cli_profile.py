"""Where the nsa-run CLI's own process spends its time (issue 13): outside the run's clock (before
the manifest's start, after its finish) the stages' ledger (bench/time_ledger.py) sees nothing.

    python3 bench/cli_profile.py OUT.txt oneshot --profile quick --out DIR

runs ``nsa-run ARGS`` in this process under cProfile and writes to OUT.txt: the wall time, when the
run's manifest says it started and finished (relative to this process's start), and the top of the
profile by cumulative time. The CLI's exit code is this script's."""

from __future__ import annotations

import cProfile
import datetime as dt
import io
import json
import pstats
import sys
import time
from pathlib import Path


def main() -> int:
    out, args = Path(sys.argv[1]), sys.argv[2:]
    t0, wall0 = time.perf_counter(), dt.datetime.now(dt.timezone.utc)
    sys.argv = ["nsa-run", *args]
    prof = cProfile.Profile()
    rc = 0
    prof.enable()
    try:
        from nsa_runner.cli import main as cli_main

        cli_main()
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    finally:
        prof.disable()
    wall = time.perf_counter() - t0
    lines = [f"nsa-run {' '.join(args)}: {wall:.2f} s in this process, exit {rc}"]
    if "--out" in args:
        runs = sorted(Path(args[args.index("--out") + 1]).glob("*/manifest.json"), key=lambda p: p.stat().st_mtime)
        if runs:
            m = json.loads(runs[-1].read_text())
            for key in ("started", "finished"):
                if m.get(key):
                    at = (dt.datetime.fromisoformat(m[key]) - wall0).total_seconds()
                    lines.append(f"manifest {key}: {at:+.1f} s after this process began (1 s resolution)")
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(45)
    lines += [ln[:170] for ln in buf.getvalue().splitlines() if ln.strip()]
    out.write_text("\n".join(lines) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
