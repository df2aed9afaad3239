"""Bad days, red-team round 19 (part A) U-4, through the CLI: a full disk during a ``stage y`` rerun. The runner put
the earlier result back (the set-aside folder emptied and removed, the attempt in history/...-abandoned), but
manifest.json could not be written to say so: it printed "the earlier result could not be put back yet (y:
history/y-..., recorded in manifest.json's pending)" naming a folder that no longer exists, and ``report`` then
said "runner died / unfinished: the nsa-run running stage y is gone (its result is missing)" of a y whose earlier
result is in place. The data handling was right; the words now match the files.

The full disk is the runner's own: from the stage's record on, every manifest write raises ENOSPC (patched in the
CLI process, no timing).
"""

from __future__ import annotations

import json
import subprocess
import sys

try:
    from _bad_days import MAIN, cli_cmd, make, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, cli_cmd, make, manifest

_FULL = MAIN.replace("from nsa_runner.cli import main", (
    "import errno\n"
    "from nsa_runner import manifest as mf\n"
    "full = []\n"
    "def record(self, entry):\n"
    "    full.append(1)\n"
    "    raise OSError(errno.ENOSPC, 'No space left on device')\n"
    "real_pair = mf._put_pair\n"
    "def put_pair(*a, **k):\n"
    "    if full:\n"
    "        raise OSError(errno.ENOSPC, 'No space left on device')\n"
    "    return real_pair(*a, **k)\n"
    "mf.RunManifest.record = record\n"
    "mf._put_pair = put_pair\n"
    "from nsa_runner.cli import main"))
assert _FULL != MAIN


def test_a_full_disk_names_the_put_back_result_as_it_is(plugins, tmp_path):
    out, env = tmp_path / "out", make(plugins)
    first = subprocess.run(cli_cmd("oneshot", "--only", "x,y,z", "--out", out, "--device", "cpu"),
                           env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    r = subprocess.run([sys.executable, "-c", _FULL, "stage", "y", "--out", str(out), "--device", "cpu"],
                       env=dict(env, BD_TEXT="v2"), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    run = out / "testrun"
    m = manifest(out)
    (note,) = m["pending"]  # the manifest could not drop it (the disk is full): the data handling is as before
    assert not (run / note["moved_to"]).exists()  # put back: the set-aside folder is gone
    assert (run / "y.txt").read_text() == "v1"
    assert [s["reason"] for s in m["stages"] if s["name"] == "y"] == ["y v1"], json.dumps(m["stages"])
    err = " ".join(r.stderr[r.stderr.index("error:"):].split())  # (the set-aside line before: it was there then)
    assert note["moved_to"] not in err.replace(" ", ""), r.stderr  # no folder that does not exist
    assert "the earlier y result is back in place" in err, r.stderr
    rep = subprocess.run(cli_cmd("report", "testrun", "--out", out), env=env, capture_output=True, text=True,
                         timeout=300)
    text = " ".join(rep.stdout.split())
    assert "its result is missing" not in text and "stage y is gone (its earlier result is in place)" in text, text
