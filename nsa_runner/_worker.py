"""Child-process side of the executor: ``python -m nsa_runner._worker JOB RESULT``.

JOB is a pickle written by the parent: ``{"spec": "module:attr", "ctx": RunContext dict,
"sys_path": [...]}``. The worker imports the stage, runs it with the context, and writes
``{"result": StageResult dict, "traceback": str|None}`` as JSON to RESULT (atomically). Its
stdout/stderr are the stage log. A crash (signal, abort) leaves no RESULT: the parent reports
that from the exit status and the log tail; faulthandler puts the Python stack in the log.
"""

from __future__ import annotations

import faulthandler
import importlib
import os
import pickle
import sys
import time
import traceback

from nsa_runner.artifacts import write_json
from nsa_runner.context import RunContext
from nsa_runner.stage import Stage, StageResult, Status


def _load(spec: str) -> Stage:
    module, _, attr = spec.partition(":")
    obj = importlib.import_module(module)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    stage = obj() if isinstance(obj, type) else obj
    if not isinstance(stage, Stage):
        raise TypeError(f"{spec} is a {type(stage).__name__}, not an nsa_runner.Stage")
    return stage


def _error(message: str, tb: str | None) -> dict:
    return {"result": StageResult(Status.ERROR, message).to_dict(), "traceback": tb}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m nsa_runner._worker JOB RESULT", file=sys.stderr)
        return 2
    job_path, result_path = argv
    faulthandler.enable()
    with open(job_path, "rb") as f:
        job = pickle.load(f)
    sys.path[:] = list(job["sys_path"]) + [p for p in sys.path if p not in job["sys_path"]]
    ctx = RunContext.from_dict(job["ctx"])
    print(f"# nsa-run stage {ctx.stage} ({job['spec']}) pid {os.getpid()} device={ctx.device} "
          f"profile={ctx.profile} options={ctx.options}", flush=True)
    t0 = time.monotonic()
    try:
        stage = _load(job["spec"])
        result = stage.run(ctx)
        if not isinstance(result, StageResult):
            out = _error(f"run() returned {type(result).__name__}, expected a StageResult", None)
        else:
            if not isinstance(result.status, Status):
                result.status = Status(result.status)
            out = {"result": result.to_dict(), "traceback": None}
    except SystemExit as e:
        out = _error(f"stage called sys.exit({e.code!r})", traceback.format_exc())
    except Exception as e:  # noqa: BLE001 - any exception is the stage's ERROR, with traceback
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        out = _error(f"{type(e).__name__}: {first}" if first else type(e).__name__, tb)
    sys.stdout.flush()
    sys.stderr.flush()
    print(f"# stage {ctx.stage}: {out['result']['status']} after {time.monotonic() - t0:.1f}s "
          f"{out['result']['reason']}", flush=True)
    try:
        write_json(result_path, out)
    except (TypeError, ValueError) as e:  # e.g. NaN or an object in metrics
        write_json(result_path, _error(f"stage result is not JSON-serialisable ({e}); "
                                       f"it was {out['result']['status']}: {out['result']['reason']}",
                                       out["traceback"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
