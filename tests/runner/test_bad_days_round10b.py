"""Bad days, an independent red-team pass beside round 10 (issue 16): what it broke, each through the CLI.

Every test here reproduces a break of that pass (see docs/reliability.md, "Red-team round 10",
"Independent probes"), which worked on the code before its fix (checked on a ``git archive`` copy):

- B1: ``nsa-run stage X`` spun at 100% CPU forever, printing nothing, when ``<out>/<run-id>`` was a
  plain file or a dangling link (no run folder, and the only name tried was taken);
- B2: ``compare`` merged every row of a timing CSV without a key column into one (a 10x read
  regression in row 1 was "no regression"), and ``--save-baseline`` wrote figures keyed ``{}`` that
  ``--baseline`` then refused;
- B3: a manifest ``files`` entry outside the run folder (``../../x.csv``, an absolute path) was read
  by ``report`` / ``compare`` and its rows copied into report.html;
- B4: a ``stage X`` rerun on a disk out of inodes moved part of the earlier result into ``history/``
  and never put it back, while saying "earlier runs are untouched";
- B5: a stage declared another stage's file through an in-folder link (``self -> .``,
  ``self/a.txt``) and its rerun moved that file into its own history;
- B6: ``.manifest.lock`` a hard link to a file outside the run folder: the next ``stage`` /
  ``oneshot`` truncated that file to 0 bytes.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

try:
    from _bad_days import PINNED, make
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import PINNED, make

# the nsa-run script itself (cli.main: what a terminal or CI job runs), run id pinned
MAIN = PINNED.replace("from nsa_runner.cli import app; app(prog_name='nsa-run')",
                      "from nsa_runner.cli import main; sys.argv[0] = 'nsa-run'; main()")
assert MAIN != PINNED


def main_cmd(*args) -> list[str]:
    return [sys.executable, "-c", MAIN, *map(str, args)]


@pytest.fixture
def bd(plugins):
    return make(plugins)


def _main(env, *args, timeout=90, **kw):
    return subprocess.run(main_cmd(*args), env=env, text=True, timeout=timeout, capture_output=True, **kw)


def _one_error_line(r, *names):
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "(unexpected" not in r.stderr, r.stderr[-2000:]
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and all(n in err[0] for n in names), r.stderr[-2000:]
    return err[0]


# ---- B1 -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("obstacle", ["file", "dangling link"])
def test_stage_passes_over_a_file_or_dangling_link_named_like_the_run_and_says_so(bd, tmp_path, obstacle):
    """`stage x` with <out>/testrun a user's file (or a link to nowhere) busy-looped forever: the only
    name it tried was taken, and "taken" was read as "another nsa-run made it: open that one"."""
    out = tmp_path / "o"
    out.mkdir()
    where = out / "testrun"
    nowhere = tmp_path / "nowhere"
    if obstacle == "file":
        where.write_text("my notes\n")
    else:
        where.symlink_to(nowhere)
    try:
        r = _main(bd, "stage", "x", "--out", out, "--device", "cpu", timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("nsa-run stage x still ran after 30 s (it spins when <out>/<run-id> is no folder)")
    assert r.returncode == 0, r.stderr[-2000:]
    # like oneshot: the name is passed over, the run goes to testrun.2, and one line says why
    assert (out / "testrun.2" / "x.txt").read_text() == "v1"
    notes = [ln for ln in r.stderr.splitlines() if ln.startswith("note:") and "passed over" in ln]
    assert len(notes) == 1 and str(where) in notes[0] and "testrun.2" in notes[0], r.stderr[-2000:]
    if obstacle == "file":
        assert where.read_text() == "my notes\n"
    else:
        assert where.is_symlink() and not nowhere.exists()
    # the next `stage` goes to the same (latest) folder
    r = _main(bd, "stage", "y", "--out", out, "--device", "cpu", timeout=30)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (out / "testrun.2" / "y.txt").exists() and not (out / "testrun.3").exists()
