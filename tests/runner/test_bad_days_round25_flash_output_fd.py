"""Bad days, red-team round 25 B25-2 (and U25-1's wording), through the CLI: env-pairing's flash probe checked its
64 MiB output cap on the output file by its NAME, so a flash package whose import renamed or unlinked the file behind
its stdout, or removed the probe's folder, printed past the cap unchecked (all of a 200 MiB flood; one printing
without end would fill TMPDIR until the 300 s probe limit), and with the folder gone FA-3 / FA-4, not even installed,
were BROKEN "not probed". Expected: the cap holds whatever the file is called now (the runner watches its own
descriptor), the package is BROKEN saying it printed more than 64 MiB (once, not "crashed the interpreter"), the
other paths are probed as usual, nothing left in TMPDIR."""

from __future__ import annotations

import pytest

try:
    from _bad_days import FA2_INIT, env_pairing_flash, plant_fa2
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import FA2_INIT, env_pairing_flash, plant_fa2

STEPS = {
    "rename": "p = os.readlink('/proc/self/fd/1'); os.rename(p, p + '.old')\n",
    "unlink": "os.unlink(os.readlink('/proc/self/fd/1'))\n",
    "rmtree": "import shutil; shutil.rmtree(os.path.dirname(os.readlink('/proc/self/fd/1')))\n",
}
# then 400 MiB at up to ~400 MiB/s, counting what it wrote (bounded: the test never fills the disk when the cap
# fails; the runner's poll runs in a thread of env-pairing, which may hold it off for a few hundred ms)
FLOOD = ("import os, time\n{step}for i in range(400):\n    os.write(1, b'F' * (1 << 20))\n"
         "    with open({count!r}, 'ab') as f: f.write(b'x')\n    time.sleep(0.0025)\n")  # one byte per MiB


@pytest.mark.parametrize("step", sorted(STEPS))
def test_the_flash_output_cap_holds_whatever_the_package_does_to_its_file(plugins, tmp_path, step):
    count = tmp_path / "count"
    plant_fa2(plugins.site, FLOOD.format(step=STEPS[step], count=str(count)) + FA2_INIT)
    r, flash, tmp = env_pairing_flash(plugins, tmp_path)
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    written = count.stat().st_size
    assert written < 400, (step, written)  # before: 400 of 400 MiB written, never stopped
    fa2 = flash["flash_attn"]
    assert fa2["ok"] is False and fa2["error"] == "its import printed more than 64 MiB (without end?); stopped", fa2
    for other in ("flash_attn_interface", "flash_attn.cute"):  # before (rmtree): BROKEN, "not probed (exit status 1)"
        assert flash[other]["not_installed"] is True, flash[other]
    assert not list(tmp.rglob("*")), list(tmp.rglob("*"))
