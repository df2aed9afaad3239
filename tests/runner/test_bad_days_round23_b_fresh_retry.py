"""Bad days, red-team round 23, through the CLI.

B23-1: a plugin's (or a flash package's) import that rebinds a standard-library attribute (``time.time`` set to a
raising function: a careless "reproducible runs" patch) got the NEXT, healthy import blamed: plugin discovery listed
the next plugin broken (``stage`` of it ERROR), env-pairing's flash probe said FA-3 BROKEN. Round 22 put back the
builtins only; one more kind of state each round never ends. Expected: an import that fails after another import ran
in the same process is imported again in a fresh process before it is blamed; only a failure that repeats alone is
the plugin's (and its reason is its own).
"""

from __future__ import annotations

import json
import subprocess

try:
    from _bad_days import FA2_INIT, cli_cmd, env_with, make, manifest, plant_fa2
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import FA2_INIT, cli_cmd, env_with, make, manifest, plant_fa2

NO_CLOCK = """import time
def _no_clock():
    raise RuntimeError("deterministic mode: wall clock disabled")
time.time = _no_clock
"""


def _stage(name: str, cls: str, order: int) -> str:
    return (f"from nsa_runner import Stage, StageResult, Status\n"
            f"class {cls}(Stage):\n    name, order, timeout_s = {name!r}, {order}, 60.0\n"
            f"    def run(self, ctx): return StageResult(Status.PASS, {name + ' ok'!r})\n")


def _first(tmp_path, dist: str, module: str, source: str, entries: dict[str, str]):
    """A plugin in a folder of its own, put first on the path: discovery imports it before the others."""
    first = tmp_path / f"first-{module}"
    info = first / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = ["[nsa_runner.stages]"] + [f"{k} = {v}" for k, v in entries.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    (first / f"{module}.py").write_text(source)
    return first


def _listed(env) -> dict:
    r = subprocess.run(cli_cmd("list", "--json"), env=env, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return {s["name"]: s for s in json.loads(r.stdout)["stages"]}


def test_a_plugin_rebinding_time_time_does_not_get_the_next_plugin_blamed(plugins, tmp_path):
    env = make(plugins)
    plugins.make("b23b-plugin", "b23b_mod", "import time\nLOADED_AT = time.time()\n" + _stage("bb23b", "B", 81),
                 {"bb23b": "b23b_mod:B"})
    # a plugin that is broken on its own, imported after the polluter too: still broken, for its own reason
    plugins.make("c23b-plugin", "c23b_mod", "raise ValueError('c23b: missing config file')\n", {"cc23b": "c23b_mod:C"})
    first = _first(tmp_path, "a23b-plugin", "a23b_mod", NO_CLOCK + _stage("aa23b", "A", 80), {"aa23b": "a23b_mod:A"})
    env = env_with(env, PYTHONPATH=f"{first}:{env['PYTHONPATH']}")
    listed = _listed(env)
    # before: "broken: failed to import b23b_mod:B: RuntimeError: deterministic mode: wall clock disabled"
    assert listed["bb23b"]["runs_here"] is True, listed["bb23b"]
    assert listed["aa23b"]["runs_here"] is True, listed["aa23b"]
    assert listed["x"]["runs_here"] is True, listed["x"]
    cc = json.dumps(listed["cc23b"])
    assert listed["cc23b"]["runs_here"] is False and "c23b: missing config file" in cc, cc
    assert "wall clock" not in cc, cc
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("stage", "bb23b", "--out", out, "--device", "cpu"), env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [(s["name"], s["status"]) for s in manifest(out)["stages"]] == [("bb23b", "PASS")]


# process state nothing can put back: an audit hook (never removable) that breaks the clock at the next import
AUDIT = """import sys, time
def _hook(event, args):
    if event == "exec" and "i23b_mod" in str(getattr(args[0], "co_filename", "")):
        time.time = None  # a sandboxing helper gone wrong
sys.addaudithook(_hook)
"""


def test_a_plugin_leaving_an_audit_hook_does_not_get_the_next_plugin_blamed(plugins, tmp_path):
    """The thread form's kin (round 23 B23-1: a Timer thread pa's import left set time.time = None while pb
    imported): state changed during the later import itself, which no put-back after an import can reach."""
    env = make(plugins)
    plugins.make("i23b-plugin", "i23b_mod", "import time\nLOADED_AT = time.time()\n" + _stage("ii23b", "I", 81),
                 {"ii23b": "i23b_mod:I"})
    first = _first(tmp_path, "h23b-plugin", "h23b_mod", AUDIT + _stage("hh23b", "H", 80), {"hh23b": "h23b_mod:H"})
    listed = _listed(env_with(env, PYTHONPATH=f"{first}:{env['PYTHONPATH']}"))
    # before: "broken: failed to import i23b_mod:I: TypeError: 'NoneType' object is not callable"
    assert listed["ii23b"]["runs_here"] is True, listed["ii23b"]
    assert listed["hh23b"]["runs_here"] is True, listed["hh23b"]



def test_a_flash_package_rebinding_time_time_does_not_get_the_next_one_blamed(plugins, tmp_path):
    env = make(plugins)
    site = plugins.site
    plant_fa2(site, NO_CLOCK + FA2_INIT)
    (site / "flash_attn_interface.py").write_text("import time\nLOADED_AT = time.time()\n"
                                                  "def flash_attn_func(*a, **k): pass\n")
    out = tmp_path / "out"
    r = subprocess.run(cli_cmd("stage", "env-pairing", "--out", out, "--device", "cpu"),
                       env=env_with(env), capture_output=True, text=True, timeout=300)
    flash = {p["module"]: p for p in json.loads((out / "testrun" / "env.json").read_text())["flash"]}
    assert flash["flash_attn"]["ok"] is True, flash["flash_attn"]
    fa3 = flash["flash_attn_interface"]
    assert fa3["ok"] is True, (fa3, r.stderr[-2000:])  # before: BROKEN "RuntimeError: deterministic mode: ..."
    (rec,) = manifest(out)["stages"]
    assert "wall clock" not in rec["reason"], rec
    env_txt = (out / "testrun" / "env.txt").read_text()
    assert "wall clock" not in env_txt, env_txt


def test_a_flash_package_broken_alone_is_still_named_for_its_own_reason(plugins, tmp_path):
    env = make(plugins)
    site = plugins.site
    plant_fa2(site, NO_CLOCK + FA2_INIT)
    (site / "flash_attn_interface.py").write_text("raise ImportError('fa3: libcuda.so.1 missing')\n")
    out = tmp_path / "out"
    subprocess.run(cli_cmd("stage", "env-pairing", "--out", out, "--device", "cpu"),
                   env=env_with(env), capture_output=True, text=True, timeout=300)
    flash = {p["module"]: p for p in json.loads((out / "testrun" / "env.json").read_text())["flash"]}
    fa3 = flash["flash_attn_interface"]
    assert fa3["ok"] is False and "fa3: libcuda.so.1 missing" in fa3["error"], fa3
    assert "wall clock" not in fa3["error"], fa3
