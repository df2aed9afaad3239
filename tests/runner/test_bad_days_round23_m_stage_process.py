"""Bad days, red-team round 23, through the CLI: the stage's own process.

B23-5: after a stage's ERROR the worker asked a fresh process what ``import torch`` says (round 22 B22-2) inside the
stage's clock, and for any traceback through a file whose path ends in ``torch/__init__.py`` (a plugin package
named ``mytorch``): a quick ERROR was recorded TIMEOUT when the asking took longer than the time left, and the
ERROR's duration held nsa-run's own torch import. Expected: asked only for torch's own ``__init__.py``, by the
runner after the stage ended (off its clock); a hang there is bounded by the discovery limit.

B23-6: a helper the stage forks that ends with ``sys.exit(0)`` (``os._exit`` was meant) or whose work raises came
back into the worker and reported as the stage: "stage called sys.exit(0)", the stage's own PASS lost. Expected:
the copy ends as it would in plain Python; the stage's result stands."""

from __future__ import annotations

import subprocess

try:
    from _bad_days import alive, cli_cmd, env_with, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import alive, cli_cmd, env_with, manifest

# a [torch.backends] entry point that counts torch's imports (one file per call)
COUNTER = """
import os
def init():
    d = os.environ["TC_DIR"]
    n = len(os.listdir(d))
    open(os.path.join(d, str(n)), "w").write(str(os.getpid()))
    mode = os.environ.get("TC_MODE", "")
    if mode == "second-fails-third-hangs" and n == 1:
        raise ImportError("tc: device busy (lock held)")
    if mode == "second-fails-third-hangs" and n >= 2:
        import time
        time.sleep(100)
"""


def _counter(plugins, tmp_path, mode: str = "") -> dict[str, str]:
    info = plugins.site / "tc_count-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tc-count\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntc = tc_count:init\n")
    (plugins.site / "tc_count.py").write_text(COUNTER)
    calls = tmp_path / f"calls-{mode or 'count'}"
    calls.mkdir()
    env = plugins.env()
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    return env_with(env, TC_DIR=str(calls), TC_MODE=mode, NSA_RUN_SPARE_WORKER="0")


RAISES = """
from nsa_runner import Stage, StageResult, Status
class T(Stage):
    name, order, timeout_s = "{name}", 15, 60.0
    def run(self, ctx):
        raise ValueError("{name}: bad input shape")
"""


def test_an_error_through_a_package_named_like_torch_asks_no_torch_import(plugins, tmp_path):
    env = _counter(plugins, tmp_path)
    calls = {}
    for pkg in ("mystage", "mytorch"):  # the same stage; only the package's name differs
        (plugins.site / pkg).mkdir()
        (plugins.site / pkg / "__init__.py").write_text(RAISES.format(name=pkg))
        plugins.make(f"{pkg}-stage", f"{pkg}_entry", f"from {pkg} import T\n", {pkg: f"{pkg}_entry:T"})
        before = len(list((tmp_path / "calls-count").iterdir()))
        out = tmp_path / f"o-{pkg}"
        r = subprocess.run(cli_cmd("oneshot", "--only", pkg, "--out", out, "--device", "cpu"), env=env,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-3000:])
        (rec,) = manifest(out)["stages"]
        assert rec["status"] == "ERROR" and rec["reason"] == f"ValueError: {pkg}: bad input shape", rec
        calls[pkg] = len(list((tmp_path / "calls-count").iterdir())) - before
    assert calls["mytorch"] == calls["mystage"], calls  # no torch import was asked for mytorch's error


FORKS = """
import os, sys, time
from nsa_runner import Stage, StageResult, Status
class F(Stage):
    name, order, timeout_s = "fk", 15, 60.0
    def run(self, ctx):
        if os.fork() == 0:  # a helper: a little work, then it leaves
            if os.environ.get("FK_HOW") == "raise":
                raise RuntimeError("helper: upload failed")
            sys.exit(0)  # (os._exit(0) was meant)
        time.sleep(0.3)
        (ctx.dir / "fk.txt").write_text("done\\n")
        return StageResult(Status.PASS, "fk ok", files=["fk.txt"])
"""


def test_a_forked_helper_that_exits_or_raises_never_reports_as_the_stage(plugins, tmp_path):
    plugins.make("fk-stage", "fk_mod", FORKS, {"fk": "fk_mod:F"})
    for how in ("exit", "raise"):
        out = tmp_path / f"o-{how}"
        r = subprocess.run(cli_cmd("oneshot", "--only", "fk", "--out", out, "--device", "cpu"),
                           env=env_with(plugins.env(), FK_HOW=how), capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, (how, r.stdout[-3000:], r.stderr[-3000:])
        (rec,) = manifest(out)["stages"]
        assert rec["status"] == "PASS" and rec["reason"] == "fk ok" and rec["files"] == ["fk.txt"], rec
        assert (out / "testrun" / "fk.txt").read_text() == "done\n"
        log = (out / "testrun" / "logs" / "fk.log").read_text()
        # the helper's own end is in the log, as plain Python would print it
        assert ("RuntimeError: helper: upload failed" in log) == (how == "raise"), log[-2000:]


def test_a_backend_hanging_in_the_fresh_import_keeps_the_stages_error_and_clock(plugins, tmp_path):
    # import 1 (the CLI's check) works, 2 (the stage's) fails, 3 (the fresh one asked after the ERROR) hangs:
    # the asking is cut at the discovery limit (8 s), after the stage's clock (4 s) stopped
    env = _counter(plugins, tmp_path, "second-fails-third-hangs")
    plugins.make("ti-stage", "ti_mod", """
from nsa_runner import Stage, StageResult, Status
class T(Stage):
    name, order, timeout_s = "ti", 15, 4.0
    def run(self, ctx):
        import torch
        return StageResult(Status.PASS, "torch imported")
""", {"ti": "ti_mod:T"})
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("oneshot", "--only", "ti", "--out", out, "--device", "cpu"),
                       env=env_with(env, NSA_RUN_DISCOVERY_TIMEOUT="8"), capture_output=True, text=True, timeout=600)
    assert r.returncode == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-3000:])
    (rec,) = manifest(out)["stages"]
    assert rec["status"] == "ERROR", rec
    assert "backend extension: tc" in rec["reason"], rec["reason"]
    assert "import torch in a fresh process" in rec["reason"], rec["reason"]
    assert "8s" in rec["reason"], rec["reason"]  # the fresh import: stopped at the limit
    assert rec["duration_s"] < 4.0, rec["duration_s"]
    for f in (tmp_path / "calls-second-fails-third-hangs").iterdir():
        assert not alive(int(f.read_text())), f.name  # the hanging import's process is gone
