"""Bad days, red-team round 24 B24-5, through the CLI: env-pairing's flash probe sent a flash package's import output
to a file in TMPDIR with no cap, and left that folder in TMPDIR when the stage was stopped (355 MB after a timeout,
2.78 GB in a tighter loop). Expected: the probe is stopped once its output passes _python.OUTPUT_CAP (the package named
BROKEN with that reason), and its files live in the stage's own temp folder, removed on every way out."""

from __future__ import annotations

import json

try:
    from _bad_days import env_pairing_flash, manifest, plant_fa2
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import env_pairing_flash, manifest, plant_fa2


def _flash(site, body: str) -> None:
    plant_fa2(site, '__version__ = "2.8.3"\n' + body)


def test_a_flash_package_printing_without_end_is_stopped_at_the_output_cap(plugins, tmp_path):
    _flash(plugins.site, "import os\nb = b'flash_attn: falling back to the slow path\\n' * 20000\n"
                         "while True:\n    os.write(1, b)\n")
    r, flash, tmp = env_pairing_flash(plugins, tmp_path)
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert flash["flash_attn"]["ok"] is False and "printed more than 64 MiB" in json.dumps(flash["flash_attn"]), flash
    assert not list(tmp.rglob("output.txt")), list(tmp.rglob("*"))


def test_the_flash_probes_files_go_with_a_stopped_stage(plugins, tmp_path):
    _flash(plugins.site, "import time\ntime.sleep(1000)\n")
    r, _, tmp = env_pairing_flash(plugins, tmp_path, "--timeout", "8")
    assert r.returncode == 1, r.stderr[-2000:]
    (rec,) = manifest(tmp_path / "o")["stages"]
    assert rec["status"] == "TIMEOUT", rec
    assert not list(tmp.glob("nsa-flash-probe-*")), list(tmp.rglob("*"))  # before: left in TMPDIR
