"""Bad days, red-team round 13 (part B), plugin breaks, each through the CLI.

Every test here reproduces a break of round 13 part B that worked on the code before its fix:

- B4: built-in-ness was still decided by files a plugin writes: a plugin dist-info named ``NSA_Run``
  whose own ``direct_url.json`` claims an editable install of the checkout, or (on a regular
  install) an ``NSA.Run.egg-info`` placed next to ``nsa_runner``, was taken for nsa-run itself: the
  real ``sanity`` was switched off ("duplicate ... (built-in)") and the plugin's stages / impls were
  "built-in" (an impl's import check in a child skipped);
- B6: ``list --impls``, ``list NAME`` and ``stage NAME --help`` printed plugin texts whole (a check
  docstring, differences, note, description, option help, a Version of megabytes);
- B10: ``list --impls --json`` printed NaN / Infinity (not JSON) for an impl's ``check.__doc__`` of
  inf or a ``Constraints.describe()`` giving NaN.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    from _bad_days import MAIN, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with

REPO = Path(__file__).resolve().parents[2]


def _main(env, *args, timeout=180, cwd=None):
    return subprocess.run([sys.executable, "-c", MAIN, *map(str, args)], env=env, text=True, timeout=timeout,
                          capture_output=True, cwd=cwd)


def _clean(r):
    assert "Traceback" not in r.stderr and "(unexpected" not in r.stderr, r.stderr[-3000:]


def _dist(site, dirname, name, version, module, source, group, entries, meta="METADATA", suffix="dist-info"):
    (site / f"{module}.py").write_text(source)
    info = site / (f"{dirname}-{version[:20]}.{suffix}" if suffix == "dist-info" else f"{dirname}.{suffix}")
    info.mkdir()
    (info / meta).write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()))
    return info


def _strict(text):
    def bad(c):
        raise ValueError(f"not JSON: {c}")
    return json.loads(text, parse_constant=bad)


# ---- B4 -------------------------------------------------------------------------------------------

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


def _assert_not_builtin(rows, dist_label):
    sanity = [s for s in rows if s["name"] == "sanity"]
    assert len(sanity) == 1 and sanity[0]["source"] == "built-in" and sanity[0]["runs_here"], sanity
    assert "evil" not in sanity[0]["entry_point"], sanity
    yy = [s for s in rows if s["name"] == "yy"]
    assert len(yy) == 1 and yy[0]["source"] == f"plugin {dist_label}", yy
    taken = [s for s in rows if "evilm:X" in json.dumps(s)]
    assert len(taken) == 1 and taken[0]["name"] != "sanity" and taken[0]["source"] != "built-in", taken


def test_a_plugin_whose_direct_url_claims_an_editable_checkout_is_a_plugin(plugins):
    """Before: its `sanity` and the real one were both ERROR "duplicate ... (built-in)", `yy` built-in."""
    info = _dist(plugins.site, "NSA_Run", "NSA_Run", "9.9", "evilm", EVIL_STAGES, "nsa_runner.stages",
                 {"sanity": "evilm:X", "yy": "evilm:Y"})
    (info / "direct_url.json").write_text(json.dumps({"dir_info": {"editable": True}, "url": f"file://{REPO}"}))
    r = _main(plugins.env(), "list", "--json")
    _clean(r)
    _assert_not_builtin(json.loads(r.stdout)["stages"], "NSA_Run 9.9")


def test_an_impl_plugin_whose_direct_url_claims_an_editable_checkout_is_a_plugin(plugins):
    """Before: listed `built-in` (and its import was not checked in a child)."""
    info = _dist(plugins.site, "NSA_Run", "NSA_Run", "9.9", "evilimp",
                 "from nsa_runner.impls.nsa_core import make\nIMPL = make()\nIMPL.name = 'evl'\n",
                 "nsa_runner.impls", {"evl": "evilimp:IMPL"})
    (info / "direct_url.json").write_text(json.dumps({"dir_info": {"editable": True}, "url": f"file://{REPO}"}))
    r = _main(plugins.env(), "list", "--impls", "--json", "--device", "cpu")
    _clean(r)
    rows = {x["name"]: x for x in json.loads(r.stdout)["impls"]}
    assert rows["nsa_core"]["source"] == "built-in", rows["nsa_core"]
    assert rows["evl"]["source"] == "plugin NSA_Run 9.9", rows["evl"]


def _regular_install(site: Path) -> None:
    """nsa-run as a wheel installs it (no editable finder): packages and a dist-info with RECORD."""
    shutil.copytree(REPO / "nsa_runner", site / "nsa_runner", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "nsa_core", site / "nsa_core", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "stages", site / "nsa_run_stages", ignore=shutil.ignore_patterns("__pycache__"))
    info = site / "nsa_run-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nsa-run\nVersion: 0.1.0\n")
    text = (REPO / "pyproject.toml").read_text()
    eps = []
    for group in ("nsa_runner.stages", "nsa_runner.impls"):
        block = text.split(f'[project.entry-points."{group}"]', 1)[1].split("\n[", 1)[0]
        eps.append(f"[{group}]")
        eps += [ln.replace('"', "") for ln in block.splitlines() if "=" in ln and not ln.startswith("#")]
    (info / "entry_points.txt").write_text("\n".join(eps) + "\n")
    files = [p.relative_to(site).as_posix() for top in ("nsa_runner", "nsa_core", "nsa_run_stages")
             for p in (site / top).rglob("*") if p.is_file()]
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files + [f"{info.name}/METADATA",
                                                                       f"{info.name}/entry_points.txt",
                                                                       f"{info.name}/RECORD"]))


def test_an_egg_info_beside_a_regular_install_is_a_plugin(tmp_path):
    """Before: `NSA.Run.egg-info` next to nsa_runner counted as nsa-run's own metadata."""
    site = tmp_path / "ne"
    site.mkdir()
    _regular_install(site)
    _dist(site, "NSA.Run", "NSA.Run", "9.9", "evilm", EVIL_STAGES, "nsa_runner.stages",
          {"sanity": "evilm:X", "yy": "evilm:Y"}, meta="PKG-INFO", suffix="egg-info")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(site)
    probe = subprocess.run([sys.executable, "-c", "import nsa_runner; print(nsa_runner.__file__)"], env=env,
                           cwd=tmp_path, text=True, capture_output=True)
    assert probe.stdout.strip() == str(site / "nsa_runner" / "__init__.py"), probe
    r = _main(env, "list", "--json", cwd=tmp_path)
    _clean(r)
    rows = json.loads(r.stdout)["stages"]
    _assert_not_builtin(rows, "NSA.Run 9.9")
    assert all(s["source"] == "built-in" for s in rows if s["name"] in ("env-pairing", "summary")), rows


# ---- B6 -------------------------------------------------------------------------------------------

BIG_IMPL = """
import os
from nsa_runner.impls import Constraints, Impl
from nsa_runner.impls.nsa_core import make

def check(case, part):
    return None

kw = {}
if os.environ.get("BIG") == "doc":
    check.__doc__ = "D" * 300_000
else:
    kw = dict(description="E" * 300_000, differences={"select": "F" * 300_000}, note="N" * 300_000)
IMPL = Impl("big", dict(make().parts), Constraints(check=check), **kw)
"""


@pytest.mark.parametrize("big", ["doc", "desc"])
def test_list_impls_clips_an_adapters_huge_texts(plugins, big):
    """Before: the table held the 300 kB texts whole (1.2 MB of output)."""
    _dist(plugins.site, "big_impl", "big-impl", "1.0", "bigimp", BIG_IMPL, "nsa_runner.impls", {"big": "bigimp:IMPL"})
    r = _main(env_with(plugins.env(), BIG=big), "list", "--impls", "--device", "cpu")
    _clean(r)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    size = len(r.stdout) + len(r.stderr)
    assert size < 40_000, (size, r.stdout[:500])
    assert "more characters" in r.stdout and "big" in r.stdout, r.stdout[-3000:]


BIG_STAGE = """
from nsa_runner import Stage, StageResult, Status
from nsa_runner.stage import Option
class T(Stage):
    name, order = "bigs", 6
    description = "Q" * 300_000
    options = [Option("--zz", help="H" * 200_000, default="d" * 100_000, choices=("c" * 100_000,))]
    def run(self, ctx):
        return StageResult(Status.PASS, "big ok")
"""


@pytest.mark.parametrize("args", [("list", "bigs"), ("stage", "bigs", "--help")], ids=["list NAME", "stage --help"])
def test_a_stages_huge_description_and_option_help_are_clipped(plugins, args):
    """Before: `list bigs` / `stage bigs --help` printed the 300 kB description and option texts whole."""
    _dist(plugins.site, "bigs_d", "bigs-d", "1.0", "bigst", BIG_STAGE, "nsa_runner.stages", {"bigs": "bigst:T"})
    r = _main(plugins.env(), *args)
    _clean(r)
    size = len(r.stdout) + len(r.stderr)
    assert size < 40_000, (size, r.returncode, r.stdout[:500], r.stderr[-1000:])
    assert "more characters" in r.stdout and "bigs" in r.stdout, (r.stdout[-3000:], r.stderr[-2000:])


@pytest.mark.parametrize("args", [("list",), ("list", "vv")], ids=["list", "list NAME"])
def test_a_distributions_huge_version_is_clipped(plugins, args):
    """Before: a METADATA `Version:` of 200 000 digits was printed whole (the source column / line)."""
    _dist(plugins.site, "vv_d", "vv-d", "1" * 200_000, "vvm",
          "from nsa_runner import Stage, StageResult, Status\n"
          "class T(Stage):\n    name, order = 'vv', 6\n"
          "    def run(self, ctx):\n        return StageResult(Status.PASS, 'ok')\n",
          "nsa_runner.stages", {"vv": "vvm:T"})
    r = _main(plugins.env(), *args)
    _clean(r)
    size = len(r.stdout) + len(r.stderr)
    assert size < 40_000, (size, r.returncode, r.stdout[:500], r.stderr[-1000:])
    assert "vv" in r.stdout and "more characters" in r.stdout, r.stdout[-3000:]


# ---- B10 ------------------------------------------------------------------------------------------

ODD_JSON = """
import os
from nsa_runner.impls import Constraints, Impl
from nsa_runner.impls.nsa_core import make

class Chk:
    __doc__ = float("inf")
    def __call__(self, case, part):
        return None

class C(Constraints):
    def describe(self):
        return {"dtypes": ["fp32"], "x": float("nan"), "y": [float("-inf")], "more": object()}

IMPL = (Impl("oj", dict(make().parts), Constraints(check=Chk())) if os.environ.get("OJ") == "inf"
        else Impl("oj", dict(make().parts), C()))
"""


@pytest.mark.parametrize("oj", ["inf", "nan"])
def test_list_impls_json_is_strict_json(plugins, oj):
    """Before: `"more": Infinity` / `"x": NaN` (not JSON)."""
    _dist(plugins.site, "oj_d", "oj-d", "1.0", "ojm", ODD_JSON, "nsa_runner.impls", {"oj": "ojm:IMPL"})
    r = _main(env_with(plugins.env(), OJ=oj), "list", "--impls", "--device", "cpu", "--json")
    _clean(r)
    doc = _strict(r.stdout)
    rows = {x["name"]: x for x in doc["impls"]}
    assert "oj" in rows and "nsa_core" in rows, rows.keys()
