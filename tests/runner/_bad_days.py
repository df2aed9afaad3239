"""Shared by the ``test_bad_days_*`` tests: a plugin whose stages misbehave on demand, and the
nsa-run CLI as a separate process with a pinned run id (the shared checkout changes while tests
run, which would change the id between two commands)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

# stages x, y, z of a plugin module that defines ``_act(ctx, name)`` (what each one does): shared by
# the bad-days plugins (BEHAVE below, test_bad_days_round3's SOURCE)
STAGES_XYZ = """
class X(Stage):
    name, order, timeout_s = "x", 10, 120.0
    def run(self, ctx):
        return _act(ctx, "x")

class Y(Stage):
    name, order, timeout_s = "y", 11, 120.0
    def run(self, ctx):
        return _act(ctx, "y")

class Z(Stage):
    name, order, timeout_s = "z", 12, 120.0
    def run(self, ctx):
        return _act(ctx, "z")
"""

# every stage reads what to do from its environment (set per test on the CLI process)
BEHAVE = """
import os, signal, subprocess, sys, time
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

def _act(ctx, name):
    mark = os.environ.get("BD_MARK")
    if os.environ.get("BD_SETSID"):  # a grandchild in a session of its own (a daemon)
        p = subprocess.Popen(["setsid", "sleep", "1000"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        Path(os.environ["BD_SETSID"]).write_text(str(p.pid))
    if os.environ.get("BD_IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    text = os.environ.get("BD_TEXT", "v1")
    (ctx.dir / f"{name}.txt").write_text(text)
    print(f"{name} wrote {text}", flush=True)
    if mark:
        Path(mark).write_text(str(os.getpid()))
    time.sleep(float(os.environ.get(f"BD_SLEEP_{name.upper()}", os.environ.get("BD_SLEEP", "0"))))
    return StageResult(Status.PASS, f"{name} {text}", files=[f"{name}.txt"])
""" + STAGES_XYZ

ENTRIES = {"x": "bd_mod:X", "y": "bd_mod:Y", "z": "bd_mod:Z"}

PINNED = ("import sys; from nsa_runner.commands import _common as c; c.current_run_id = lambda: 'testrun'; "
          "from nsa_runner.cli import app; app(prog_name='nsa-run')")
# the same through the console entry (``cli.main``: one-line errors, exit codes, the bytecode cache)
MAIN = PINNED.replace("from nsa_runner.cli import app; app(prog_name='nsa-run')",
                      "from nsa_runner.cli import main; sys.argv[0] = 'nsa-run'; main()")
assert MAIN != PINNED


def make(plugins) -> dict[str, str]:
    plugins.make("bd-plugin", "bd_mod", BEHAVE, ENTRIES)
    env = plugins.env()
    env.pop("BD_MARK", None)
    return env


def cli_cmd(*args) -> list[str]:
    return [sys.executable, "-c", PINNED, *map(str, args)]


def manifest(out: Path) -> dict:
    return json.loads((out / "testrun" / "manifest.json").read_text())


def wait_for(path: Path, timeout: float = 60.0, proc=None) -> str:
    """The text of ``path`` once it exists and is not empty (the stage got that far)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and path.stat().st_size:
            return path.read_text()
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the CLI ended (rc {proc.returncode}) before {path.name} appeared")
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def signalled_when(cmd: list, env: dict, mark: Path, sig: int, wait_s: float = 120.0, settle_s: float = 0.3,
                   **popen) -> tuple[int, str]:
    """Run ``cmd``; once ``mark`` is written (the stage got there), wait ``settle_s`` and send it ``sig``. Returns
    (its exit status, its stderr); it is never left running."""
    import subprocess

    p = subprocess.Popen(cmd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)
    try:
        wait_for(mark, wait_s, p)
        time.sleep(settle_s)
        p.send_signal(sig)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode, err


def alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


def env_with(env: dict[str, str], **kw) -> dict[str, str]:
    e = dict(env)
    e.update({k: str(v) for k, v in kw.items()})
    return e


def dead_pid() -> int:
    """A pid that belonged to a process that has exited."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


# a FAKE flash-attn 2 install (no kernels: env-pairing's flash probe only imports it and reads its metadata), for
# probes of what a flash package's import may do to the probe; ``init`` is flash_attn/__init__.py
FA2_INIT = '__version__ = "2.8.3"\ndef flash_attn_func(*a, **k): pass\ndef flash_attn_varlen_func(*a, **k): pass\n'


def plant_fa2(site: Path, init: str = FA2_INIT) -> None:
    (site / "flash_attn").mkdir()
    (site / "flash_attn" / "__init__.py").write_text(init)
    (site / "flash_attn_2_cuda.py").write_text("")
    info = site / "flash_attn-2.8.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: flash_attn\nVersion: 2.8.3\n")


def env_pairing_flash(plugins, tmp_path: Path, *extra: str):
    """``nsa-run stage env-pairing`` with ``plugins`` on the path and a TMPDIR of its own: (the finished process,
    env.json's flash records by module, that TMPDIR)."""
    import subprocess

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("stage", "env-pairing", "--out", out, "--device", "cpu", *extra),
                       env=env_with(plugins.env(), TMPDIR=str(tmp)), capture_output=True, text=True, timeout=600)
    env_json = out / "testrun" / "env.json"
    flash = {p["module"]: p for p in json.loads(env_json.read_text())["flash"]} if env_json.exists() else {}
    return r, flash, tmp


def changes_then_checks(plugins, tmp_path: Path, tag: str, changes: str, checks: str):
    """Two implementation plugins: ``<tag>m`` (module ``<tag>_changes``: leaves process state changed, in its call or
    at its import) and ``<tag>k`` (module ``<tag>_checks``: asserts nothing of it is left), then ``selection_map`` over
    both and nsa_core: (the finished process, the stage's record, its log's text)."""
    for role, impl in (("changes", "m"), ("checks", "k")):
        plugins.make(f"{tag}-{role}", f"{tag}_{role}", changes if role == "changes" else checks,
                     {f"{tag}{impl}": f"{tag}_{role}:IMPL"}, version="1.0", group="nsa_runner.impls")
    return selection_map(plugins, tmp_path, f"{tag}m,{tag}k,nsa_core")


def put_back_and_named(result, names) -> None:
    """``changes_then_checks``' result: the stage PASSed (the checker found nothing left) and the log's put-back note
    names each of ``names``."""
    r, rec, log = result
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:], log[-3000:])
    for name in names:
        assert name in log, (name, log[-3000:])


def selection_map(plugins, tmp_path: Path, impls: str, own_process: bool = False):
    """``nsa-run stage selection-map --impl IMPLS`` on the CPU into ``tmp_path / "o"``, ``plugins`` on the path: (the
    finished process, the stage's manifest record, its log's text). The tests of the put-back in the stage's process
    (still the guard of sanity, prefill-bench and decode-bench) run the adapters there (``NSA_RUN_ADAPTER_PROCESS=0``);
    ``own_process``: each plugin adapter in a process of its own, as nsa-run does by default since round 47."""
    import subprocess

    out = tmp_path / "o"
    env = {**plugins.env(), "NSA_RUN_ADAPTER_PROCESS": "1" if own_process else "0"}
    r = subprocess.run(cli_cmd("stage", "selection-map", "--impl", impls, "--out", out, "--device", "cpu"),
                       env=env, capture_output=True, text=True, timeout=900)
    (rec,) = manifest(out)["stages"]
    log = out / "testrun" / "logs" / "selection-map.log"
    return r, rec, log.read_text(errors="replace") if log.is_file() else ""


def running_first(*stages: tuple[str, str, int, str]) -> str:
    """A stage plugin module's source: for each (attribute, stage name, order, code), a stage whose run executes
    ``code`` first (what plugin code leaves behind), then PASSes with the reason "<name> ok"."""
    head = ("from nsa_runner import Stage, StageResult, Status\n\n"
            "def _stage(name, order, code):\n"
            "    def run(self, ctx):\n"
            "        exec(code, {})\n"
            "        return StageResult(Status.PASS, name + ' ok')\n"
            "    return type(name, (Stage,), {'name': name, 'order': order, 'timeout_s': 120.0, 'run': run})\n\n")
    return head + "".join(f"{attr} = _stage({name!r}, {order}, {code!r})\n" for attr, name, order, code in stages)
