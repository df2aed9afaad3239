"""Round 14 A BR-3 (for executor.py): a stage that swaps nsa-run's own temp folders.

- BR-3a: a stage replaced its worker temp folder (``$TMPDIR/nsa-run-<stage>-<runner pid>-*``) by a
  symlink to an outside folder: the worker wrote ``result.json`` there through the link, and the
  whole run stopped: exit 2 "incomplete: Cannot call rmtree on a symbolic link", no path named, the
  later stages never ran (a plain file in its place: "incomplete: Not a directory").
- BR-3b / BR-3c: a stage replaced the next stage's spare's ``preload.log`` by a symlink to an outside
  file (copied to the head of the next stage's log) or by a FIFO (the spare hung on it; the next
  stage was TIMEOUT "did not begin within 125s").

Expected: the stage that did it is ERROR naming its temp folder and what was put there, nothing is
written or read through the link, the run goes on with the later stages (exit 1), nothing is left in
the temp folder. Through the CLI (run id pinned), TMPDIR a folder of the test's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

try:
    from _bad_days import PINNED, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import PINNED, env_with

RT = """
import os, subprocess
from nsa_runner import Stage, StageResult, Status

def _act(ctx, name):
    (ctx.dir / f"{name}.txt").write_text(name)
    cmd = os.environ.get(f"RT14A_{name.upper()}_CMD")
    if cmd:
        subprocess.run(["bash", "-c", cmd], cwd=ctx.dir, check=True)
    return StageResult(Status.PASS, f"{name} done", files=[f"{name}.txt"])

class A(Stage):
    name, order, timeout_s = "a", 10, 120.0
    def run(self, ctx): return _act(ctx, "a")

class B(Stage):
    name, order, timeout_s = "b", 11, 120.0
    def run(self, ctx): return _act(ctx, "b")

class C(Stage):
    name, order, timeout_s = "c", 12, 120.0
    def run(self, ctx): return _act(ctx, "c")

class Q(Stage):
    name, order, timeout_s = "q", 13, 5.0
    def run(self, ctx): return _act(ctx, "q")
"""


@pytest.fixture
def rt(plugins, tmp_path):
    plugins.make("rt14a-tmp-plugin", "rt14a_tmp_mod", RT,
                 {"a": "rt14a_tmp_mod:A", "b": "rt14a_tmp_mod:B", "c": "rt14a_tmp_mod:C", "q": "rt14a_tmp_mod:Q"})
    env = plugins.env()
    for k in [k for k in env if k.startswith("RT14A_")]:
        env.pop(k)
    env.pop("NSA_RUN_SPARE_WORKER", None)  # the spare on (the default)
    (tmp_path / "tmp").mkdir()
    env["TMPDIR"] = str(tmp_path / "tmp")
    return env


def _oneshot(env, out, only: str, **kw):
    return subprocess.run([sys.executable, "-c", PINNED, "oneshot", "--only", only, "--out", str(out),
                           "--device", "cpu"], env=env_with(env, **kw), text=True, capture_output=True,
                          timeout=400)


def _stages(out) -> dict:
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    assert not m.get("incomplete"), m.get("incomplete")
    return {s["name"]: s for s in m["stages"]}


def _left(env) -> list[str]:
    return sorted(p for p in os.listdir(env["TMPDIR"]) if p.startswith("nsa-run-"))


# the stage's own temp folder, found as a stage can find it
SWAP_LINK = 'D=$(ls -d "$TMPDIR"/nsa-run-{s}-*); mv "$D" "$D.real"; ln -s {outside} "$D"'
SWAP_FILE = 'D=$(ls -d "$TMPDIR"/nsa-run-{s}-*); rm -rf "$D"; echo x > "$D"'


@pytest.mark.parametrize("who", ["a", "b"])  # a: a fresh worker; b: the spare started while a ran
def test_br3a_a_stage_swapping_its_temp_folder_for_a_link_is_its_error_and_the_run_goes_on(rt, tmp_path, who):
    out, outside = tmp_path / "out", tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    r = _oneshot(rt, out, "a,b,c", **{f"RT14A_{who.upper()}_CMD": SWAP_LINK.format(s=who, outside=outside)})
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert "incomplete" not in r.stderr and "rmtree" not in r.stderr, r.stderr[-2000:]
    st = _stages(out)
    assert st[who]["status"] == "ERROR", st[who]
    assert "replaced by a symlink" in st[who]["reason"] and f"nsa-run-{who}-" in st[who]["reason"], st[who]["reason"]
    assert str(outside) in st[who]["reason"], st[who]["reason"]
    for other in {"a", "b", "c"} - {who}:
        assert st[other]["status"] == "PASS", st[other]
    assert sorted(os.listdir(outside)) == ["keep.txt"], "nsa-run wrote through the link"
    assert (outside / "keep.txt").read_text() == "keep"
    assert _left(rt) == [], "the stage's temp folder (moved aside) or the link was left"


def test_br3a_a_stage_putting_a_file_in_place_of_its_temp_folder_is_its_error(rt, tmp_path):
    out = tmp_path / "out"
    r = _oneshot(rt, out, "a,b", RT14A_A_CMD=SWAP_FILE.format(s="a"))
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    st = _stages(out)
    assert st["a"]["status"] == "ERROR" and "replaced by a file" in st["a"]["reason"], st["a"]
    assert st["b"]["status"] == "PASS", st["b"]
    assert _left(rt) == []


SPARE_LINK = 'S=$(ls -d "$TMPDIR"/nsa-run-spare-*); rm -f "$S/preload.log"; ln -s {secret} "$S/preload.log"'
SPARE_FIFO = 'S=$(ls -d "$TMPDIR"/nsa-run-spare-*); rm -f "$S/preload.log"; mkfifo "$S/preload.log"'


def test_br3b_the_spares_preload_log_swapped_for_a_link_copies_nothing_from_outside(rt, tmp_path):
    out, secret = tmp_path / "out", tmp_path / "secret.txt"
    secret.write_text("SECRET-OUTSIDE-CONTENT\n")
    r = _oneshot(rt, out, "a,b", RT14A_A_CMD=SPARE_LINK.format(secret=secret))
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    st = _stages(out)
    assert (st["a"]["status"], st["b"]["status"]) == ("PASS", "PASS"), st
    log = (out / "testrun" / "logs" / "b.log").read_text()
    assert "SECRET-OUTSIDE-CONTENT" not in log, log[:2000]
    assert "# nsa-run stage b" in log, log[:2000]
    assert secret.read_text() == "SECRET-OUTSIDE-CONTENT\n"


def test_br3c_the_spares_preload_log_swapped_for_a_fifo_does_not_hold_the_next_stage(rt, tmp_path):
    out = tmp_path / "out"
    r = _oneshot(rt, out, "a,q", RT14A_A_CMD=SPARE_FIFO)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    st = _stages(out)
    assert (st["a"]["status"], st["q"]["status"]) == ("PASS", "PASS"), st
    assert "did not begin" not in st["q"]["reason"], st["q"]
