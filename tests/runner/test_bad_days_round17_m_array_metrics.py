"""Bad days (round 17, noticed fixing U-2), through the CLI: a stage metric holding a numpy array or a tensor of
more than one element was ERROR "not JSON-serialisable (RuntimeError: a Tensor with 2 elements cannot be converted
to Scalar)": the JSON conversion tried ``.item()`` before ``.tolist()``. Expected: stored as a list."""

from __future__ import annotations

import subprocess

try:
    from _bad_days import cli_cmd, env_with, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, env_with, manifest

STAGES = """
import numpy as np
import torch
from nsa_runner import Stage, StageResult, Status

class Arr(Stage):
    name, order, timeout_s = "arr", 80, 120.0
    def run(self, ctx):
        return StageResult(Status.PASS, "ok", metrics={"t": torch.tensor([1.5, 2.5]), "a": np.array([1, 2, 3]),
                                                       "s": torch.tensor(4.0), "n": np.float32(0.5)})
"""


def test_array_metrics_are_stored_as_lists(plugins, tmp_path):
    plugins.make("m17-arr", "m17_arr_mod", STAGES, {"arr": "m17_arr_mod:Arr"})
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("oneshot", "--only", "arr", "--out", out, "--device", "cpu"),
                       env=env_with(plugins.env(), NSA_RUN_SPARE_WORKER="0"), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (rec,) = manifest(out)["stages"]
    assert rec["status"] == "PASS" and rec["metrics"] == {"t": [1.5, 2.5], "a": [1, 2, 3], "s": 4.0, "n": 0.5}, rec
