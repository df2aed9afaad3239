"""One plugin adapter's part of a stage, in a process of its own (``_parity.in_own_process``): its rows of
triton-fwd / triton-bwd (``isolated_rows``), its select on selection-map's sample (``isolated_select``), or its
checks of sanity (``sanity._isolated_checks``).

``run([JOB, OUT])``, started with the stage process's ``sys.path``: JOB (JSON) names the kind, the implementation and
what the stage's part needs (the measure function, device, profile, ``--cases``, seed; or the sample's T and seed);
the results go to OUT (written whole, then renamed), and the process ends at once with ``os._exit``: an atexit hook or
a finalizer the adapter left never runs after its rows (red-team round 47 B47b-6: one rewrote the stage's CSV after
its verdict). Its working directory is a temp folder of its own, never the run folder.
"""

from __future__ import annotations

import importlib
import json
import os
import sys


def main(argv: list[str]) -> int:
    job_path, out_path = argv
    with open(job_path) as f:
        job = json.load(f)
    if job["kind"] == "select":  # selection-map
        from . import selection_map

        selection_map.select_in_host(job, out_path)
        return 0
    if job["kind"] == "sanity":
        from . import sanity

        sanity.checks_in_host(job, out_path)
        return 0
    from . import _parity  # (this package: nsa_run_stages as installed, stages in a checkout)

    module, _, qualname = job["measure"].partition(":")
    measure = importlib.import_module(module)
    for part in qualname.split("."):
        measure = getattr(measure, part)
    cases = _parity.cases_for(job["profile"], job["cases"])
    position = {c.id: i for i, c in enumerate(_parity.cases_for(job["profile"]))}
    part = _parity.entry_rows(_parity.load_impl(job["name"]), cases, job["device"], int(job["seed"]), position,
                              measure)
    text = json.dumps({"rows": part["rows"], "wrote": {str(k): v for k, v in part["wrote"].items()},
                       "differences": part["differences"], "note": part["note"]})
    tmp = out_path + ".part"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, out_path)
    return 0


def run(argv: list[str]) -> None:
    """``main``, then the process ends at once (``os._exit``): no atexit hook or finalizer of the adapter's runs."""
    try:
        code = main(argv)
    except KeyboardInterrupt:  # a real SIGINT to this process (the adapter's own is its failure, in its rows): it
        sys.stdout.flush()  # ends by that signal, which the stage names in the adapter's rows
        sys.stderr.flush()
        import signal

        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    except BaseException:  # noqa: BLE001 - said in the stage's log; the stage names this process's end
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run(sys.argv[1:])
