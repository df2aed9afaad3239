"""Bad days, red-team round 32 U32-2 / U32-4 / U32-5, through the CLI:

- U32-2: a Unicode space around ``--seed`` (or any integer option) was stripped as white space, and the refusal
  quoted the text stripped: only ASCII white space is dropped; anything else is refused, quoted as typed;
- U32-4: an unwritable ``NSA_RUN_CPROFILE_DIR`` lost every stage's profile, said only in the stages' logs: refused up
  front in one line, exit 2, nothing run;
- U32-5: ``compare`` showed ``inf`` beside "no value in A" for a timing cell of ``1e309``: said to be infinite.
(U32-3, the log limit's upper bound: tests/runner/test_bad_days_log_limit.py.)"""

from __future__ import annotations

import csv
import os
import subprocess

import pytest
from typer.testing import CliRunner

from nsa_runner.cli import app

try:  # tests/ is on sys.path under pytest's default (prepend) import mode
    from _bad_days import cli_cmd, env_with
    from _runfolders import make_pair
except ImportError:  # pragma: no cover - run as a package
    from tests._runfolders import make_pair
    from tests.runner._bad_days import cli_cmd, env_with


@pytest.mark.parametrize("value", ["\u20037", "7\u00a0", "\u30007"])
def test_a_unicode_space_around_an_integer_option_is_refused_as_typed(tmp_path, value):
    for flag in ("--seed", "--T"):
        out = tmp_path / f"o{flag}"
        r = subprocess.run(cli_cmd("stage", "selection-map", flag, value, "--out", out, "--device", "cpu"),
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 2, (flag, r.returncode, r.stderr[-2000:])
        assert ascii(value)[1:-1] in r.stderr or value in r.stderr, (flag, r.stderr)  # quoted as typed
        assert "Traceback" not in r.stderr and not (out / "testrun").exists()


def test_an_unwritable_profile_folder_is_refused_before_anything_runs(plugins, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("stage", "selection-map", "--out", out, "--device", "cpu"),
                       env=env_with(plugins.env(), NSA_RUN_CPROFILE_DIR=str(blocker / "profiles")),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "NSA_RUN_CPROFILE_DIR" in r.stderr and "cannot write profiles there" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (out / "testrun").exists()
    # a writable one is taken: the stage's profile is written there
    profiles = tmp_path / "profiles"
    r = subprocess.run(cli_cmd("stage", "selection-map", "--out", out, "--device", "cpu"),
                       env=env_with(plugins.env(), NSA_RUN_CPROFILE_DIR=str(profiles)),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (profiles / "selection-map.prof").is_file()


def test_compare_says_an_infinite_timing_is_infinite(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = make_pair(tmp_path / "runs", device="cpu")
    path = root / "aaaaaaa" / "decode.csv"
    rows = list(csv.DictReader(path.open()))
    rows[0]["ms_full"] = "1e309"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    r = CliRunner().invoke(app, ["compare", "aaaaaaa", "bbbbbbb", "--out", str(root)])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    text = " ".join(r.output.split())
    assert "an infinite value in A" in text, r.output  # before: inf beside "no value in A"
    assert "no value in A" not in text, r.output


def test_a_relative_or_blank_profile_folder_is_the_users(plugins, tmp_path):
    """Round 33 B33-7: a relative NSA_RUN_CPROFILE_DIR was checked relative to the user's working folder but written
    relative to the worker's, inside the run folder (an undeclared folder there; the named one stayed empty); a blank
    one was made a folder named by its spaces."""
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("stage", "selection-map", "--out", out, "--device", "cpu"),
                       env=env_with(plugins.env(), NSA_RUN_CPROFILE_DIR="profiles"), cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "profiles" / "selection-map.prof").is_file()
    assert not list(out.rglob("*.prof")), list(out.rglob("*.prof"))
    r = subprocess.run(cli_cmd("stage", "selection-map", "--out", tmp_path / "o2", "--device", "cpu"),
                       env=env_with(plugins.env(), NSA_RUN_CPROFILE_DIR="  "), cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not (tmp_path / "  ").exists() and not list((tmp_path / "o2").rglob("*.prof"))


@pytest.mark.parametrize(("name", "value"), [
    ("NSA_RUN_PARITY_JOBS", "0" * 5000 + "99"),  # round 33 U33-4: Python's digit-limit advice, the variable unnamed
    ("NSA_RUN_PARITY_JOBS", "\u20034"),  # U33-5: a Unicode space was stripped, unlike the options
    ("NSA_RUN_LOG_LIMIT_MIB", "\u200364"),
])
def test_environment_numbers_are_read_as_the_options_are(tmp_path, name, value):
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("stage", "selection-map", "--out", out, "--device", "cpu"),
                       env=env_with(dict(os.environ), **{name: value}), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert name in r.stderr and "digits" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert not (out / "testrun").exists()


@pytest.mark.parametrize("value", [" profiles", "\n", "\r", "\u00a0", "prof\u00a0", "pro\x1bfiles"])
def test_an_odd_profile_folder_is_refused_or_taken_as_named(plugins, tmp_path, value):
    """Round 34 B34-6: a leading space, a lone newline or CR, a no-break space made folders of those names in the
    working folder. A blank value (ASCII white space only) is unset; a control character or a Unicode space at an end is
    refused in one line; surrounding ASCII white space is dropped."""
    out = tmp_path / "o"
    work = tmp_path / "w"
    work.mkdir()
    r = subprocess.run(cli_cmd("stage", "selection-map", "--out", out, "--device", "cpu"),
                       env=env_with(plugins.env(), NSA_RUN_CPROFILE_DIR=value), cwd=work,
                       capture_output=True, text=True, timeout=600)
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    if value == " profiles":
        assert r.returncode == 0 and (work / "profiles" / "selection-map.prof").is_file(), r.stderr[-2000:]
    elif value in ("\n", "\r"):
        assert r.returncode == 0 and not list(work.iterdir()), (r.stderr[-2000:], list(work.iterdir()))
    else:
        assert r.returncode == 2 and "NSA_RUN_CPROFILE_DIR" in r.stderr, r.stderr[-2000:]
        assert not list(work.iterdir()) and not (out / "testrun").exists()


def test_a_profile_folder_inside_out_is_refused(plugins, tmp_path):
    """Round 35 B35-4: NSA_RUN_CPROFILE_DIR naming the run folder: the profile's <stage>.txt overwrote the stage's own
    declared <stage>.txt after its PASS, and an undeclared <stage>.prof was left among the run's files."""
    out = tmp_path / "o"
    for inside in (out, out / "testrun", out / "p"):
        r = subprocess.run(cli_cmd("stage", "selection-map", "--out", out, "--device", "cpu"),
                           env=env_with(plugins.env(), NSA_RUN_CPROFILE_DIR=str(inside)),
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 2 and "is inside --out" in r.stderr, (inside, r.stderr[-2000:])
        assert "Traceback" not in r.stderr and not (out / "testrun").exists()
