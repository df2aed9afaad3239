"""nsa_runner._bytecode through the CLI (issue 13): where the environment forbids writing bytecode
(PYTHONDONTWRITEBYTECODE=1, as the H100 image and this CI machine set it), every nsa-run process
compiled the sources it imports that ship without .pyc files (on the H100: 2.8 s per torch import,
4.4-6.5 s per FA-4 import). The CLI now sends its processes' bytecode to a per-user cache folder,
never beside the sources; env.json says where it went."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN



def _env_pairing(tmp_path, **env_over):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX", "NSA_RUN_PYCACHE")}
    env.update({"XDG_CACHE_HOME": str(tmp_path / "cache"), **env_over})
    out = tmp_path / "o"
    r = subprocess.run([sys.executable, "-c", MAIN, "oneshot", "--only", "env-pairing", "--device", "cpu",
                        "--out", str(out)], env=env, text=True, capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    facts = json.loads((out / "testrun" / "env.json").read_text())["facts"]["python"]
    return facts, tmp_path / "cache" / "nsa-run" / "pycache"


def test_no_bytecode_wish_sends_the_bytecode_to_the_cache_folder(tmp_path):
    facts, cache = _env_pairing(tmp_path, PYTHONDONTWRITEBYTECODE="1")
    assert facts["bytecode"] == f"cache {cache}", facts
    written = list(cache.rglob("*.pyc"))
    assert any("torch" in str(p) for p in written), written[:5]  # the stage's process wrote torch's there
    assert any("nsa_runner" in str(p) for p in written)


@pytest.mark.parametrize("how", ["off", "readonly", "default"])
def test_the_environment_is_left_as_it_was(tmp_path, how):
    """NSA_RUN_PYCACHE=0, a cache folder that cannot be written (a prefix Python cannot write would
    make every process compile everything), or no PYTHONDONTWRITEBYTECODE at all: nothing changes."""
    env = {"PYTHONDONTWRITEBYTECODE": "1"}
    if how == "off":
        env["NSA_RUN_PYCACHE"] = "0"
    elif how == "readonly":
        if os.geteuid() == 0:
            (tmp_path / "cache").write_text("a file where the cache folder would be")  # root ignores modes
        else:
            (tmp_path / "cache").mkdir(mode=0o500)
    facts, cache = _env_pairing(tmp_path, **env) if how != "default" else _default(tmp_path)
    assert not cache.exists()
    want = "beside the sources" if how == "default" else "not written (PYTHONDONTWRITEBYTECODE)"
    assert facts["bytecode"] == want, facts


def _default(tmp_path):
    saved = os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    try:
        return _env_pairing(tmp_path)
    finally:
        if saved is not None:
            os.environ["PYTHONDONTWRITEBYTECODE"] = saved
