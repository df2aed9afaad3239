"""Bad days, red-team round 16 (part A) A6, through the CLI: a plugin's import renamed the discovery
folder's ``result.jsonl``, put a symlink to an outside file at its name and ended the process
(``os._exit(3)``). The discovery child's keeper then reopened the name to say how the import ended and
appended its JSON line to the outside file (``{"ended": 3, "nonce": ...}``).

Expected: nothing is written outside (the result file is opened once, before any plugin code runs,
never through a link, and written only through that descriptor); the plugin is named broken (the CLI
reads the result through its own descriptor too: it had blamed "invalid:discovery", exit code 0, and
listed no plugin stage); the other stages are still listed.

A9: a plugin's import opened ``/proc/<CLI pid>/fd/1`` (same user) and wrote into ``list --json``'s
stdout: not JSON any more. Expected: the CLI's stdout is out of the discovery children's reach while
they run (parked in a socket of the CLI's own, fd 1 on /dev/null meanwhile): stdout is pure JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys

try:
    from _bad_days import MAIN, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with

SWAP_RESULT = """
import glob, os
_mark = os.environ["R16L_MARK"]
if os.environ.get("NSA_RUN_STAGE_COOKIE") and not os.path.exists(_mark):
    open(_mark, "w").write("x")
    for _r in glob.glob(os.path.join(os.environ["TMPDIR"], "nsa-run-discover-*", "result.jsonl")):
        os.rename(_r, _r + ".bak")
        os.symlink(os.environ["R16L_VICTIM"], _r)
    os._exit(3)
from nsa_runner import Stage, StageResult, Status
class R(Stage):
    name, order = "rswap", 16
    def run(self, ctx): return StageResult(Status.PASS, "r")
"""

GOOD = """
from nsa_runner import Stage, StageResult, Status
class Ok(Stage):
    name, order = "okl", 17
    def run(self, ctx): return StageResult(Status.PASS, "ok")
"""


def test_a6_a_plugin_swapping_result_jsonl_for_a_link_gets_nothing_written_outside(plugins, tmp_path):
    plugins.make("r16l-swap", "r16l_swap_mod", SWAP_RESULT, {"rswap": "r16l_swap_mod:R"})
    plugins.make("r16l-good", "r16l_good_mod", GOOD, {"okl": "r16l_good_mod:Ok"})
    tmp, victim, mark = tmp_path / "tmp", tmp_path / "victim.txt", tmp_path / "swapped"
    tmp.mkdir()
    victim.write_text("precious\n")
    env = env_with(plugins.env(), TMPDIR=str(tmp), R16L_VICTIM=str(victim), R16L_MARK=str(mark),
                   NSA_RUN_SPARE_WORKER="0")
    r = subprocess.run([sys.executable, "-c", MAIN, "list", "--json"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert mark.exists(), "the plugin's import never ran"  # (the attack happened)
    assert victim.read_text() == "precious\n"  # nothing appended through the link
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.returncode in (0, 1), (r.returncode, r.stderr[-3000:])
    listed = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    assert "sanity" in listed and listed["sanity"]["source"] == "built-in", listed.get("sanity")
    # the plugin whose import did it is the broken one (the parent reads the result through its own
    # descriptor, not the name); the others are listed and run
    assert "okl" in listed and listed["okl"]["runs_here"], listed
    broken = [s for s in listed.values() if not s["runs_here"] and "broken" in s["why_not"]]
    assert [s["entry_point"] for s in broken] == ["r16l_swap_mod:R"], broken
    assert "exit code 3" in broken[0]["why_not"], broken
    assert r.returncode == 1
    assert not [p.name for p in tmp.iterdir() if p.name.startswith("nsa-run-discover-")], list(tmp.iterdir())


WRITE_STDOUT = """
import os
_mark = os.environ["R16L_MARK"]
if os.environ.get("NSA_RUN_STAGE_COOKIE") and not os.path.exists(_mark):
    open(_mark, "w").write("x")
    _cli = int(os.environ["NSA_RUN_PARENT_PID"])  # (or found by walking up /proc: the same process)
    for _fd in ("1", "2"):
        try:
            with open(f"/proc/{_cli}/fd/{_fd}", "w") as _f:
                _f.write(f"NOT JSON FROM A PLUGIN via fd {_fd}\\n")
        except OSError:
            pass
from nsa_runner import Stage, StageResult, Status
class P(Stage):
    name, order = "lprint", 16
    def run(self, ctx): return StageResult(Status.PASS, "p")
"""


def test_a9_a_plugin_import_writing_into_the_clis_stdout_leaves_list_json_pure(plugins, tmp_path):
    plugins.make("r16l-print", "r16l_print_mod", WRITE_STDOUT, {"lprint": "r16l_print_mod:P"})
    mark = tmp_path / "wrote"
    env = env_with(plugins.env(), TMPDIR=str(tmp_path), R16L_MARK=str(mark), NSA_RUN_SPARE_WORKER="0")
    r = subprocess.run([sys.executable, "-c", MAIN, "list", "--json"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert mark.exists(), "the plugin's import never ran"
    assert "NOT JSON" not in r.stdout, r.stdout[:500]
    assert r.returncode == 0, r.stderr[-3000:]
    listed = {s["name"]: s for s in json.loads(r.stdout)["stages"]}  # pure JSON
    assert listed["lprint"]["runs_here"], listed["lprint"]
    # the CLI's own output after discovery still reaches stdout (put back): the table
    r = subprocess.run([sys.executable, "-c", MAIN, "list"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "lprint" in r.stdout and "sanity" in r.stdout, (r.stdout[-2000:], r.stderr[-2000:])
