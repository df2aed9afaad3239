"""Bad days, red-team round 12 (part B), each break through the CLI.

Every test here reproduces a break of round 12 part B that worked on the code before its fix:

- B1: two plugins declaring the same stage name ``zz``: the table and ``--json`` listed ``zz``
  twice ("1 passed, 2 failed") while manifest / summary / junit kept one entry;
- B2: a plugin distribution named ``nsa_run`` / ``NSA.Run`` was taken for nsa-run itself (built-in):
  it knocked the real ``sanity`` out, and its impl adapter skipped the child import check;
- B3: junit.xml was quadratic in a declared case table's rows (60 000 rows: more than 10 min);
- B4: ``nsa-run list`` printed a broken plugin's whole import error (15 MB);
- B5: an impl plugin's Constraints of the wrong type, or a ``check`` that raises, took the whole
  sanity stage down with an ERROR not naming the plugin;
- B6: a SKIPped stage with a declared case table showed as passing testcases in junit.xml.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

try:
    from _bad_days import MAIN, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with

from nsa_runner.results.junit import suite_status

# stage a: writes a.csv, a case table of $R12_ROWS PASS rows, and returns $R12_STATUS with it declared
STAGES = """
import os
from nsa_runner import Stage, StageResult, Status

class A(Stage):
    name, order, timeout_s = "a", 15, 300.0
    def run(self, ctx):
        n = int(os.environ.get("R12_ROWS", "2"))
        with open(ctx.dir / "a.csv", "w") as f:
            f.write("case,status,ms\\n")
            for i in range(n):
                f.write(f"c{i},PASS,1.0\\n")
        return StageResult(Status(os.environ.get("R12_STATUS", "PASS")), "no gpu here", files=["a.csv"])
"""


@pytest.fixture
def a_env(plugins):
    plugins.make("r12b-plugin", "r12b_mod", STAGES, {"a": "r12b_mod:A"})
    return plugins.env()


def _main(env, *args, timeout=120):
    return subprocess.run([sys.executable, "-c", MAIN, *map(str, args)], env=env, text=True, timeout=timeout,
                          capture_output=True)


def _clean(r):
    assert "Traceback" not in r.stderr and "(unexpected" not in r.stderr, r.stderr[-3000:]


# ---- B3 -------------------------------------------------------------------------------------------


def test_junit_of_a_50000_row_case_table_is_written_in_seconds(a_env, tmp_path):
    """Before: junitparser recounted the suite on every add (6 000 rows 61 s, 60 000 > 10 min)."""
    out = tmp_path / "o"
    t0 = time.monotonic()
    try:
        r = _main(env_with(a_env, R12_ROWS=50000), "oneshot", "--out", out, "--only", "a", "--device", "cpu",
                  timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("oneshot with a 50 000-row case table did not end within 90 s (junit.xml quadratic)")
    took = time.monotonic() - t0
    _clean(r)
    assert r.returncode == 0, r.stderr[-2000:]
    suite = next(ET.fromstring((out / "testrun" / "junit.xml").read_bytes()).iter("testsuite"))
    assert suite.get("tests") == "50000" and suite_status(suite) == "PASS"
    assert took < 40, took  # a regression guard, not a benchmark (a few seconds here)


# ---- B6 -------------------------------------------------------------------------------------------


def test_a_skipped_stage_with_a_case_table_is_skipped_in_junit(a_env, tmp_path):
    """Before: <testsuite name="a" tests="2" skipped="0">, two passing testcases: read as PASS."""
    out = tmp_path / "o"
    r = _main(env_with(a_env, R12_STATUS="SKIP"), "oneshot", "--out", out, "--only", "a", "--device", "cpu")
    _clean(r)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((out / "testrun" / "summary.json").read_text())["counts"]["skipped"] == 1
    suite = next(ET.fromstring((out / "testrun" / "junit.xml").read_bytes()).iter("testsuite"))
    assert suite.get("tests") == "2" and suite.get("skipped") == "2", ET.tostring(suite, encoding="unicode")
    assert suite_status(suite) == "SKIP"
    for tc in suite.iter("testcase"):
        sk = tc.find("skipped")
        assert sk is not None and "no gpu here" in (sk.get("message") or ""), ET.tostring(tc, encoding="unicode")


# ---- B1 -------------------------------------------------------------------------------------------

DUP = """
from nsa_runner import Stage, StageResult, Status
class Z(Stage):
    name, order = "zz", 16
    def run(self, ctx):
        return StageResult(Status.PASS, "zz")
"""


@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_one_stage_name_declared_by_two_plugins_is_one_error_everywhere(a_env, plugins, tmp_path, as_json):
    """Before: the table and --json listed zz twice ("1 passed, 2 failed"), summary and junit once."""
    plugins.make("p1", "dupm", DUP, {"zz": "dupm:Z"})
    plugins.make("p2", "dupm", DUP, {"zz": "dupm:Z"})
    env = plugins.env()
    out = tmp_path / "o"
    r = _main(env, "oneshot", "--out", out, "--only", "a,zz", "--device", "cpu", *(["--json"] if as_json else []))
    _clean(r)
    assert r.returncode == 1, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    run = out / "testrun"
    m = json.loads((run / "manifest.json").read_text())
    zz = [s for s in m["stages"] if s["name"] == "zz"]
    assert len(zz) == 1 and zz[0]["status"] == "ERROR", m["stages"]
    assert "p1" in zz[0]["reason"] and "p2" in zz[0]["reason"], zz[0]["reason"]
    summary = json.loads((run / "summary.json").read_text())
    if as_json:
        doc = json.loads(r.stdout)
        names = [s["name"] for s in doc["stages"]]
        assert names.count("zz") == 1, names
        assert doc["counts"]["failed"] == 1 and doc["counts"]["passed"] == 1, doc["counts"]
    else:
        assert "1 passed, 1 failed" in r.stdout, r.stdout[-2000:]
        assert "2 failed" not in r.stdout
    assert "1 passed, 1 failed" in (run / "summary.md").read_text()
    root = ET.fromstring((run / "junit.xml").read_bytes())
    assert [s.get("name") for s in root.iter("testsuite")].count("zz") == 1
    assert [s["name"] for s in summary["stages"]].count("zz") == 1, summary["stages"]


# ---- B2 -------------------------------------------------------------------------------------------

EVIL_STAGES = """
from nsa_runner import Stage, StageResult, Status
class X(Stage):
    name, order = "sanity", 20
    def run(self, ctx):
        return StageResult(Status.PASS, "not the real sanity")
class Y(Stage):
    name, order = "yy", 21
    def run(self, ctx):
        return StageResult(Status.PASS, "yy")
"""


def _dist(site, dirname, name, version, module, source, group, entries):
    (site / f"{module}.py").write_text(source)
    info = site / f"{dirname}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()))


@pytest.mark.parametrize("dist", ["nsa_run", "NSA.Run", "nsa--run"])
def test_a_plugin_named_like_nsa_run_is_a_plugin_and_never_switches_the_real_sanity_off(plugins, dist):
    """Before: its `sanity` and the real one were both ERROR "duplicate ... (built-in)", `yy` was built-in."""
    _dist(plugins.site, dist, dist, "9.9", "evil1", EVIL_STAGES, "nsa_runner.stages",
          {"sanity": "evil1:X", "yy": "evil1:Y"})
    r = _main(plugins.env(), "list", "--json")
    _clean(r)
    rows = json.loads(r.stdout)["stages"]
    sanity = [s for s in rows if s["name"] == "sanity"]
    assert len(sanity) == 1 and sanity[0]["source"] == "built-in" and sanity[0]["runs_here"], sanity
    assert "evil1" not in sanity[0]["entry_point"], sanity
    yy = [s for s in rows if s["name"] == "yy"]
    assert len(yy) == 1 and yy[0]["source"] == f"plugin {dist} 9.9", yy
    taken = [s for s in rows if "evil1:X" in json.dumps(s)]
    assert len(taken) == 1 and taken[0]["name"] != "sanity" and taken[0]["source"] != "built-in", taken


def test_an_impl_plugin_named_like_nsa_run_is_import_checked_in_a_child(plugins, tmp_path):
    """Before: `Name: NSA.Run` skipped the child import check; its segfault killed the sanity stage
    (ERROR SIGSEGV, nsa_core's checks lost)."""
    _dist(plugins.site, "NSA.Run", "NSA.Run", "0.0.1", "evil3", "import ctypes\nctypes.string_at(0)\n",
          "nsa_runner.impls", {"evil": "evil3:IMPL"})
    out = tmp_path / "o"
    r = _main(plugins.env(), "oneshot", "--out", out, "--only", "sanity", "--impl", "nsa_core,evil",
              "--device", "cpu", timeout=300)
    _clean(r)
    st = json.loads((out / "testrun" / "manifest.json").read_text())["stages"]
    sanity = next(s for s in st if s["name"] == "sanity")
    assert sanity["status"] == "FAIL", sanity
    assert "evil" in sanity["reason"] and "SIGSEGV" in sanity["reason"], sanity["reason"]
    checks = json.loads((out / "testrun" / "sanity.json").read_text())["checks"]
    assert sum(1 for c in checks if c["ok"]) >= 10, len(checks)  # nsa_core's ran


# ---- B5 -------------------------------------------------------------------------------------------

ODD = """
import os
from nsa_runner.impls import Constraints, Impl
from nsa_runner.impls.nsa_core import make

def _raise(case, part):
    return 1 / 0

_C = {"mhd": dict(max_head_dim="abc"), "raise": dict(check=_raise)}[os.environ.get("ODD", "mhd")]
IMPL = Impl("odd", dict(make().parts), Constraints(**_C))
"""


@pytest.mark.parametrize("odd", ["mhd", "raise"])
def test_an_impl_whose_constraints_break_is_its_own_failure_and_nsa_core_still_runs(plugins, tmp_path, odd):
    """Before: sanity was ERROR "TypeError: '>' not supported ..." / "ZeroDivisionError", naming no
    implementation, and nsa_core's checks were lost."""
    _dist(plugins.site, "odd_impl", "odd-impl", "1.0", "oddimp", ODD, "nsa_runner.impls", {"odd": "oddimp:IMPL"})
    env = env_with(plugins.env(), ODD=odd)
    if odd == "mhd":  # listed broken, naming the field
        r = _main(env, "list", "--impls", "--json", "--device", "cpu")
        _clean(r)
        rows = {x["name"]: x for x in json.loads(r.stdout)["impls"]}
        assert rows["odd"]["broken"] and "max_head_dim" in rows["odd"]["why_not"], rows["odd"]
    out = tmp_path / "o"
    r = _main(env, "oneshot", "--out", out, "--only", "sanity", "--impl", "nsa_core,odd", "--device", "cpu",
              timeout=300)
    _clean(r)
    st = json.loads((out / "testrun" / "manifest.json").read_text())["stages"]
    sanity = next(s for s in st if s["name"] == "sanity")
    assert sanity["status"] == "FAIL", sanity
    assert "odd" in sanity["reason"], sanity["reason"]
    assert ("max_head_dim" if odd == "mhd" else "ZeroDivisionError") in sanity["reason"], sanity["reason"]
    checks = json.loads((out / "testrun" / "sanity.json").read_text())["checks"]
    core = [c for c in checks if not c["check"].startswith("odd")]
    assert len(core) >= 10 and all(c["ok"] for c in core), [c for c in core if not c["ok"]][:3]


# ---- B4 -------------------------------------------------------------------------------------------

HBIG = 'raise ValueError("\\x1b[2J" + "x\\n" * 100000 + "\\u202e end")\n'


@pytest.mark.parametrize("args", [("list",), ("list", "q"), ("stage", "q", "--device", "cpu")],
                         ids=["list", "list NAME", "stage NAME"])
def test_a_broken_plugins_huge_import_error_is_clipped_in_the_terminal(plugins, tmp_path, args):
    """Before: `list` printed the whole error (15 MB, 100 025 lines), `list q` 200 kB, `stage q` 86 kB."""
    _dist(plugins.site, "hbig_d", "hbig-d", "1.0", "hbig", HBIG, "nsa_runner.stages", {"q": "hbig:Q"})
    extra = ("--out", tmp_path / "o") if args[0] == "stage" else ()
    r = _main(plugins.env(), *args, *extra, timeout=120)
    _clean(r)
    assert r.returncode != 0, r.stdout[-2000:]
    size = len(r.stdout) + len(r.stderr)
    assert size < 40_000, (size, r.stdout[:500], r.stderr[-1000:])
    assert "more characters" in r.stdout + r.stderr, (r.stdout[-3000:], r.stderr[-3000:])
