"""Bad days, red-team round 20 (part A) A20-R2, through the CLI: a hand-edited manifest whose ``argv`` (or
``planned``) is a truthy non-list (-1, 1e308, true) made ``report`` end "error: TypeError: 'int' object is not
iterable (unexpected ...)"; 0 / false / null / "x" / {} already read "'argv' must be a list, got int", exit 2.

Root: ``load_manifest`` iterated ``data.get(key) or []`` to check the items were strings BEFORE the field's type
check: a falsy value became [] (and was then caught by the type check), a truthy non-list was iterated. Now the
type check comes first, for every non-list value.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

try:
    from _bad_days import MAIN, cli_cmd, make
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, cli_cmd, make

# the truthy non-lists that broke, and 0 (already named before) as the control
_VALUES = [(-1, "int"), (1e308, "float"), (True, "bool"), (0, "int")]


def test_a_non_list_argv_or_planned_is_named_not_an_unexpected_error(plugins, tmp_path):
    out, env = tmp_path / "out", make(plugins)
    first = subprocess.run(cli_cmd("oneshot", "--only", "x", "--out", out, "--device", "cpu"),
                           env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    run = out / "testrun"
    for key in ("argv", "planned"):
        for value, kind in _VALUES:
            folder = tmp_path / "edited"
            shutil.rmtree(folder, ignore_errors=True)
            shutil.copytree(run, folder)
            m = json.loads((folder / "manifest.json").read_text())
            m[key] = value
            (folder / "manifest.json").write_text(json.dumps(m))
            r = subprocess.run([sys.executable, "-c", MAIN, "report", str(folder)], env=env, capture_output=True,
                               text=True, timeout=300)
            said = f"{key}={value!r}: rc {r.returncode}\n{r.stdout}{r.stderr}"
            assert r.returncode == 2, said
            assert "unexpected" not in r.stderr and "Traceback" not in r.stderr, said
            assert f"'{key}' must be a list, got {kind}" in r.stderr, said
            assert [ln for ln in r.stderr.splitlines() if ln.startswith("error:")] == r.stderr.splitlines()[:1], said
