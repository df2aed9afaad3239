"""Bad days, red-team round 27 B27-3, B27-4, B27-5, through the CLI: the stage's worker put back less than
``adapter_code`` does after plugin code, and env-pairing's flash probe put back no resource limits:

- B27-3: a stage arming a timer as it returns PASS (a forgotten timeout guard, its handler raising): the timer fired
  while the worker wrote the result, ERROR "not JSON-serialisable (TimeoutError ...)" or "died with SIGALRM";
- B27-4: a stage lowering the soft RLIMIT_AS to what it uses: ERROR "exited with code 1 without a result";
- B27-5: a flash package whose import set RLIMIT_FSIZE to 10 bytes: FA-2 "import crashed the interpreter", the probe's
  own record writing failing.

Expected: timers cancelled and every resource limit put back before nsa-run's code runs again; the results stand."""

from __future__ import annotations

import subprocess

try:
    from _bad_days import FA2_INIT, cli_cmd, env_pairing_flash, manifest, plant_fa2, running_first
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import FA2_INIT, cli_cmd, env_pairing_flash, manifest, plant_fa2, running_first

TIMER = ("import signal\n"
         "def _guard(*a):\n    raise TimeoutError('guard fired')\n"
         "signal.signal(signal.SIGALRM, _guard)\nsignal.setitimer(signal.ITIMER_REAL, 0.02)\n")
ADDRESS_SPACE = ("import resource\nused = int(open('/proc/self/statm').read().split()[0]) * 4096\n"
                 "resource.setrlimit(resource.RLIMIT_AS, (used, resource.getrlimit(resource.RLIMIT_AS)[1]))\n")


def test_a_timer_or_limit_a_stage_left_is_undone_before_its_result_is_written(plugins, tmp_path):
    plugins.make("r27-stages", "r27_stages", running_first(("A", "r27t", 11, TIMER), ("B", "r27m", 12, ADDRESS_SPACE)),
                 {"r27t": "r27_stages:A", "r27m": "r27_stages:B"})
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("oneshot", "--only", "r27t,r27m", "--out", out, "--device", "cpu"),
                       env=plugins.env(), capture_output=True, text=True, timeout=900)
    recs = {s["name"]: (s["status"], s["reason"]) for s in manifest(out)["stages"]}
    # before: r27t ERROR (the guard fired in the worker's result writing), r27m ERROR "exited ... without a result"
    assert recs == {"r27t": ("PASS", "r27t ok"), "r27m": ("PASS", "r27m ok")}, (recs, r.stderr[-2000:])


def test_a_resource_limit_a_flash_packages_import_set_is_put_back(plugins, tmp_path):
    plant_fa2(plugins.site, "import resource\nresource.setrlimit(resource.RLIMIT_FSIZE, (10, resource.RLIM_INFINITY))\n"
              + FA2_INIT)
    r, flash, _ = env_pairing_flash(plugins, tmp_path)
    assert flash["flash_attn"]["ok"] is True, (flash["flash_attn"], r.stderr[-2000:])  # before: "crashed"
