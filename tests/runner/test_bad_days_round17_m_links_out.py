"""Bad days, red-team round 17 (part A) U-e, through the CLI: a hand-edited manifest whose files / log name a
path outside the run folder (``/etc/passwd``, the protocol-relative ``//evil.example/x``, ``../x``) was linked
as is by report.html: a link out of the report (to another host, for ``//``). Nothing was read, only linked.

Expected: links only to names that stay in the run folder; other names are shown as text.
"""

from __future__ import annotations

import json
import re
import subprocess

try:
    from _bad_days import cli_cmd, env_with, make
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, env_with, make

OUT_NAMES = ["/etc/passwd", "//evil.example/x", "../x", "a/../../y", "\\\\evil\\share"]


def test_names_leading_out_of_the_run_folder_are_never_links(plugins, tmp_path):
    env = make(plugins)
    out = tmp_path / "out"
    r = subprocess.run(cli_cmd("oneshot", "--only", "x", "--out", out, "--device", "cpu"), env=env_with(env),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    path = out / "testrun" / "manifest.json"
    m = json.loads(path.read_text())
    m["stages"][0]["files"] = ["x.txt", *OUT_NAMES]
    m["stages"][0]["log"] = "/etc/shadow"
    path.write_text(json.dumps(m))
    (out / "testrun" / ".manifest.json.good").unlink(missing_ok=True)  # a hand edit, as a user makes it
    r = subprocess.run(cli_cmd("report", "testrun", "--out", out), env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    html = (out / "testrun" / "report.html").read_text()
    hrefs = re.findall(r'href="([^"]*)"', html)
    assert "./x.txt" in hrefs, hrefs
    assert all(h.startswith("./") and ".." not in h.split("/") and "%2F" not in h.upper() for h in hrefs), hrefs
    for name in ("/etc/passwd", "//evil.example/x", "/etc/shadow"):
        assert name in html  # shown, as text
