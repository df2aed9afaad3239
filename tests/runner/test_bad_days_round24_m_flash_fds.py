"""Bad days, red-team round 24 B24-4 (round 23 U23-7), through the CLI: env-pairing's flash probe wrote its records on
a descriptor opened before the flash package's import; a package closing inherited descriptors at import
(``os.closerange(3, 1024)``, "daemon hygiene") was reported FA-2 "BROKEN: import crashed the interpreter" with the
probe script's own traceback, though the import finished. Expected: the records file is opened by its name for each
record; the package is probed as it is."""

from __future__ import annotations

import json
import subprocess

try:
    from _bad_days import FA2_INIT, cli_cmd, env_with, plant_fa2
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import FA2_INIT, cli_cmd, env_with, plant_fa2


def test_a_flash_package_closing_inherited_descriptors_is_probed_as_it_is(plugins, tmp_path):
    site = plugins.site
    plant_fa2(site, 'import os\nos.closerange(3, 1024)\n' + FA2_INIT)
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("stage", "env-pairing", "--out", out, "--device", "cpu"), env=env_with(plugins.env()),
                       capture_output=True, text=True, timeout=300)
    flash = {p["module"]: p for p in json.loads((out / "testrun" / "env.json").read_text())["flash"]}
    assert flash["flash_attn"]["ok"] is True, (flash["flash_attn"], r.stderr[-2000:])  # before: "crashed"
    assert "Bad file descriptor" not in (out / "testrun" / "env.txt").read_text()
