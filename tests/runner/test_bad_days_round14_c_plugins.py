"""Bad days, red-team round 14 (part B), helper c: plugin metadata and impl texts, each through the CLI.

- R1: a plugin's distribution Name / Version, entry-point name / value and its options (defaults,
  choices, flags, help, their number) and order were recorded and printed whole: a 55 MB METADATA
  Name made each stage's `source` 55 MB (a manifest its own reader refused), `list --json` printed
  MBs, an order of 10**4000 squeezed the list table;
- R3: an impl's SKIP reason (its Constraints.check's return) was written whole into sanity.json;
- R2: an adapter's own KeyboardInterrupt subclass saying ``__module__ = "nsa_runner.executor"`` passed
  as the runner's interrupt and ended selection-map anonymously;
- R4: an option default nested 900 deep passed discovery, then pickling the stage's context crashed
  the runner ("RecursionError ... (unexpected)"), the run left unfinished;
- R6: built-in stages were described in the discovery child after the plugins' imports: a plugin
  setting ``Sanity.requires = ("cuda",)`` switched sanity off (SKIP), one wrapping json.dumps made it vanish.
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


def _main(env, *args, timeout=300, cwd=None):
    return subprocess.run([sys.executable, "-c", MAIN, *map(str, args)], env=env, text=True, timeout=timeout,
                          capture_output=True, cwd=cwd)


def _clean(r):
    assert "Traceback" not in r.stderr and "(unexpected" not in r.stderr, r.stderr[-3000:]


def _dist(site: Path, dirname: str, name: str, version: str, module: str, source: str, group: str, entries: str):
    (site / f"{module}.py").write_text(source)
    info = site / f"{dirname}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n" + entries)


BIG_SRC = """
from nsa_runner import Option, Stage, StageResult, Status
class A(Stage):
    name = 'ok1'; order = 201; preload = False
    def run(self, ctx): return StageResult(Status.PASS, 'x')
class Many(Stage):
    name = 'd-many'; order = 202; preload = False
    options = tuple(Option(f"--o{i}", str, default="v", help="h" * 50) for i in range(2000))
    def run(self, ctx): return StageResult(Status.PASS, 'many')
class Choices(Stage):
    name = 'd-choices'; order = 203; preload = False
    options = (Option("--c", str, default="c0", choices=tuple(f"c{i}" for i in range(20000)), help="h"),)
    def run(self, ctx): return StageResult(Status.PASS, 'choices')
class BigDef(Stage):
    name = 'd-bigdef'; order = 204; preload = False
    options = (Option("--b", str, default="D" * 300000, help="h"),)
    def run(self, ctx): return StageResult(Status.PASS, 'bigdef')
class BigOrder(Stage):
    name = 'd-order'; order = 10 ** 4000; preload = False
    def run(self, ctx): return StageResult(Status.PASS, 'order')
class Help(Stage):
    name = 'd-help'; order = 205; preload = False
    description = "W" * 300000
    options = (Option("--h", str, default="x", help="H" * 300000),)
    def run(self, ctx): return StageResult(Status.PASS, 'help')
"""


def test_r1_plugin_metadata_and_options_are_clipped_or_bounded(plugins, tmp_path):
    site = plugins.site
    _dist(site, "big_dist", "big-dist-" + "N" * 300_000, "1." + "9" * 300_000, "bigmod_c", BIG_SRC,
          "nsa_runner.stages",
          "ok1 = bigmod_c:A\nd-many = bigmod_c:Many\nd-choices = bigmod_c:Choices\nd-bigdef = bigmod_c:BigDef\n"
          "d-order = bigmod_c:BigOrder\nd-help = bigmod_c:Help\n"
          "e" + "x" * 300_000 + " = bigmod_c:A\nval = bigmod_c:" + "Q" * 300_000 + "\n")
    env = plugins.env() | {"COLUMNS": "160"}
    r = _main(env, "list", "--json")
    _clean(r)
    assert r.returncode == 1  # broken entries
    assert len(r.stdout) < 200_000, len(r.stdout)
    rows = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    assert rows["ok1"]["runs_here"] and len(rows["ok1"]["source"]) < 1000, rows["ok1"]["source"][:300]
    for name, why in (("d-many", "options"), ("d-choices", "choices"), ("d-bigdef", "characters as JSON"),
                      ("d-order", "order must be")):
        assert rows[name]["why_not"].startswith("broken:") and why in rows[name]["why_not"], rows[name]["why_not"][:500]
    assert rows["d-help"]["runs_here"]
    assert len(rows["d-help"]["description"]) < 5000 and len(rows["d-help"]["options"][0]["help"]) < 2000
    assert all(len(n) < 100 for n in rows), [n[:100] for n in rows]
    assert all(len(s["entry_point"]) < 300 for s in rows.values())
    # the table keeps its columns, for the built-ins too
    r = _main(env, "list")
    _clean(r)
    assert len(r.stdout) < 200_000
    sanity = [ln for ln in r.stdout.splitlines() if " sanity " in ln]
    assert sanity and "built-in" in sanity[0], r.stdout[:3000]
    # one stage in detail, and its --help
    for args in (("list", "d-help"), ("stage", "d-help", "--help")):
        r = _main(env, *args)
        _clean(r)
        assert len(r.stdout) < 50_000, (args, len(r.stdout))
    # the run's records: each plugin stage's source clipped, the run finished
    out = tmp_path / "runs"
    r = _main(env, "oneshot", "--only", "ok1,d-help,summary", "--out", out)
    _clean(r)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    assert m["finished"] and (out / "testrun" / "manifest.json").stat().st_size < 200_000
    assert all(len(s["source"]) < 1000 for s in m["stages"])


def test_r1_impl_plugin_metadata_is_clipped(plugins):
    _dist(plugins.site, "bigi_dist", "bigi-dist-" + "N" * 300_000, "1." + "9" * 300_000, "bigimp_c",
          "from nsa_runner.impls import Impl\nfrom nsa_runner.impls.nsa_core import make\n"
          "IMPL = lambda: Impl('bigi', dict(make().parts))\n", "nsa_runner.impls",
          "bigi = bigimp_c:IMPL\n" + "i" + "x" * 300_000 + " = bigimp_c:IMPL\n")
    r = _main(plugins.env(), "list", "--impls", "--json", "--device", "cpu")
    _clean(r)
    assert len(r.stdout) < 100_000, len(r.stdout)
    rows = {i["name"]: i for i in json.loads(r.stdout)["impls"]}
    assert rows["bigi"]["runs_here"] and len(rows["bigi"]["source"]) < 1000
    assert all(len(n) < 100 for n in rows)


HUGE_IMPL = """
from nsa_runner.impls import Constraints, Impl
def _never(*a): raise RuntimeError("never called")
PARTS = {p: _never for p in ("select", "selection_attention", "compressed_attention", "sliding_attention",
                             "nsa_attention")}
BIG = "A" * (2 << 20)
HUGEA = lambda: Impl("hugea", dict(PARTS), Constraints(check=lambda case, part: BIG), note="N" * (1 << 20))
"""


def test_r3_an_impls_huge_skip_reason_is_clipped_where_it_is_given(plugins, tmp_path):
    _dist(plugins.site, "hugeimp_c", "hugeimp-c", "1.0", "hugeimp_c", HUGE_IMPL, "nsa_runner.impls",
          "hugea = hugeimp_c:HUGEA\n")
    out = tmp_path / "runs"
    r = _main(plugins.env(), "oneshot", "--only", "sanity,summary", "--device", "cpu", "--impl", "nsa_core,hugea",
              "--out", out, timeout=600)
    _clean(r)
    run = out / "testrun"
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    sanity = run / "sanity.json"
    assert sanity.stat().st_size < 500_000, sanity.stat().st_size
    doc = json.loads(sanity.read_text())
    reasons = [s["reason"] for s in doc.get("skipped", []) if str(s.get("reason", "")).startswith("hugea")]
    assert reasons and all("more characters" in x and len(x) < 3000 for x in reasons), [x[:100] for x in reasons]
    assert sum(p.stat().st_size for p in run.rglob("*") if p.is_file()) < 5_000_000
    assert (run / "report.html").is_file()


FAKE_IMPL = """
from nsa_runner.impls import Constraints, Impl
from nsa_runner.impls.nsa_core import make
class Terminated(KeyboardInterrupt):
    pass
Terminated.__module__ = "nsa_runner.executor"
Terminated.__qualname__ = "Terminated"
def _check(case, part):
    raise Terminated()
ODDFAKE = lambda: Impl("oddfake", {"select": make().parts["select"]}, Constraints(check=_check))
"""


def test_r2_an_adapters_interrupt_class_named_like_the_runners_is_its_own_failure(plugins, tmp_path):
    _dist(plugins.site, "fakeimp_c", "fakeimp-c", "1.0", "fakeimp_c", FAKE_IMPL, "nsa_runner.impls",
          "oddfake = fakeimp_c:ODDFAKE\n")
    out = tmp_path / "runs"
    r = _main(plugins.env(), "oneshot", "--only", "selection-map", "--device", "cpu", "--impl", "nsa_core,oddfake",
              "--out", out, timeout=600)
    _clean(r)
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    rec = next(s for s in m["stages"] if s["name"] == "selection-map")
    assert "without a result" not in rec["reason"], rec["reason"]
    assert rec["status"] in ("PASS", "FAIL"), (rec["status"], rec["reason"])
    text = "\n".join(p.read_text(errors="replace") for p in (out / "testrun").glob("selection_map*"))
    assert "oddfake" in text and "Terminated" in text, text[-2000:]


DEEP_SRC = """
from nsa_runner import Stage, StageResult, Status, Option
def _deep():
    d = []
    x = d
    for _ in range(900):
        x.append([]); x = x[0]
    return d
class Ok(Stage):
    name = "ok-a"; order = 201; preload = False
    def run(self, ctx): return StageResult(Status.PASS, "a")
class Deep(Stage):
    name = "d-deep"; order = 205; preload = False
    options = (Option("--deep", str, default=_deep(), help="h"),)
    def run(self, ctx): return StageResult(Status.PASS, "deep")
class PDeep(Stage):
    name = "d-pdeep"; order = 206; preload = False
    options = (Option("--p", lambda text: _deep(), default=None, help="h"),)
    def run(self, ctx): return StageResult(Status.PASS, "pdeep")
class Later(Stage):
    name = "ok-z"; order = 300; preload = False
    def run(self, ctx): return StageResult(Status.PASS, "z")
"""


def test_r4_an_option_default_nested_900_deep_is_a_broken_stage_and_the_run_ends(plugins, tmp_path):
    _dist(plugins.site, "deepp_c", "deepp-c", "1.0", "deepm_c", DEEP_SRC, "nsa_runner.stages",
          "ok-a = deepm_c:Ok\nd-deep = deepm_c:Deep\nd-pdeep = deepm_c:PDeep\nok-z = deepm_c:Later\n")
    env = plugins.env()
    out = tmp_path / "runs"
    r = _main(env, "oneshot", "--only", "ok-a,d-deep,ok-z,summary", "--out", out)
    _clean(r)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    assert m["finished"] and m["exit_code"] == 1
    st = {s["name"]: s for s in m["stages"]}
    assert st["ok-a"]["status"] == "PASS" and st["ok-z"]["status"] == "PASS" and st["summary"]["status"] == "PASS"
    assert st["d-deep"]["status"] == "ERROR" and "deep" in st["d-deep"]["reason"], st["d-deep"]["reason"]
    # a parse that returns such a value: one line, exit 2, nothing run
    r = _main(env, "stage", "d-pdeep", "--p", "x", "--out", tmp_path / "runs2")
    _clean(r)
    assert r.returncode == 2 and "deep" in r.stderr and len(r.stderr.splitlines()) <= 3, (r.returncode, r.stderr)


PATCH_SRC = """
import json
import nsa_run_stages.env_pairing as e, nsa_run_stages.sanity as s
e.EnvPairing.requires = ("cuda",)
s.Sanity.requires = ("cuda",)
_orig = json.dumps
def dumps(obj, *a, **k):
    try:
        if isinstance(obj, dict):
            ent = obj.get("entry") or {}
            if ent.get("name") == "sanity" or (obj.get("loading") or "").startswith("nsa-run\\tsanity"):
                return _orig({"noop": 1}, *a, **k)
    except Exception:
        pass
    return _orig(obj, *a, **k)
json.dumps = dumps
import nsa_runner.impls.nsa_core as core
from nsa_runner.impls import Constraints
_make = core.make
def make():
    i = _make()
    i.constraints = Constraints(needs_cuda=True)
    return i
core.make = make
from nsa_runner import Stage, StageResult, Status
class Quiet(Stage):
    name = "aaquiet"; order = 5; preload = False
    def run(self, ctx): return StageResult(Status.PASS, "nothing to see")
from nsa_runner.impls import Impl
QIMPL = lambda: Impl("qimpl", dict(_make().parts))
"""


def test_r6_a_plugin_cannot_change_or_hide_the_built_in_stages(plugins, tmp_path):
    site = plugins.site
    (site / "mpatch_c.py").write_text(PATCH_SRC)
    info = site / "mpatch_c-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mpatch-c\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[nsa_runner.stages]\naaquiet = mpatch_c:Quiet\n"
                                           "[nsa_runner.impls]\nqimpl = mpatch_c:QIMPL\n")
    env = plugins.env()
    # (run outside the checkout: its nsa_run.egg-info on sys.path[0] ('' = the cwd) would list the built-ins
    # before the plugin, which the attack needs after it)
    r = _main(env, "list", "--json", "--device", "cpu", cwd=tmp_path)
    _clean(r)
    rows = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    assert "aaquiet" in rows and rows["aaquiet"]["runs_here"]
    for name in ("sanity", "env-pairing"):
        assert name in rows, sorted(rows)
        row = rows[name]
        assert row["source"] == "built-in" and row["requires"] == [] and row["runs_here"], row
    r = _main(env, "list", "--impls", "--json", "--device", "cpu", cwd=tmp_path)
    _clean(r)
    impls = {i["name"]: i for i in json.loads(r.stdout)["impls"]}
    assert impls["nsa_core"]["runs_here"] and impls["nsa_core"]["source"] == "built-in", impls["nsa_core"]
    out = tmp_path / "runs"
    r = _main(env, "oneshot", "--only", "aaquiet,env-pairing,summary", "--out", out, timeout=600, cwd=tmp_path)
    _clean(r)
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    st = {s["name"]: s for s in m["stages"]}
    ep = st["env-pairing"]
    assert ep["status"] in ("PASS", "FAIL") and ep["source"] == "built-in", ep
