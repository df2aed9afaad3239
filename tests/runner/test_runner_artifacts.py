"""Artifacts: atomic writers, run id from git (clean / dirty / outside git), manifest validation."""

from __future__ import annotations

import json
import math
import shutil
import subprocess

import pandas as pd
import pytest

from nsa_runner.artifacts import (
    ManifestError,
    load_manifest,
    new_run_folder,
    run_id,
    write_csv,
    write_json,
    write_text,
)


def test_writers_round_trip_and_leave_no_temp_files(tmp_path):
    write_text(tmp_path / "a" / "b.txt", "héllo\n")
    write_json(tmp_path / "x.json", {"v": 1, "p": tmp_path, "t": (1, 2)})
    df = pd.DataFrame({"case": ["B1-T8K", "B2-T1K"], "rel_err": [1e-6, 2e-3]})
    write_csv(tmp_path / "c.csv", df)
    write_csv(tmp_path / "d.csv", [{"a": 1, "b": "x"}])
    assert (tmp_path / "a" / "b.txt").read_text() == "héllo\n"
    assert json.loads((tmp_path / "x.json").read_text()) == {"v": 1, "p": str(tmp_path), "t": [1, 2]}
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "c.csv"), df)
    assert pd.read_csv(tmp_path / "d.csv").to_dict("records") == [{"a": 1, "b": "x"}]
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_a_failed_write_keeps_the_previous_file(tmp_path):
    p = tmp_path / "m.json"
    write_json(p, {"ok": True})
    with pytest.raises(ValueError):
        write_json(p, {"bad": math.nan})  # JSON has no NaN: refused, not written as NaN
    with pytest.raises(TypeError):
        write_json(p, {"bad": object()})
    with pytest.raises(ValueError):
        write_csv(tmp_path / "c.csv", "not a table")
    assert json.loads(p.read_text()) == {"ok": True}
    assert sorted(x.name for x in tmp_path.iterdir()) == ["m.json"]


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    r = tmp_path / "repo"
    (r / "nsa_core").mkdir(parents=True)
    (r / "nsa_core" / "a.py").write_text("x = 1\n")
    (r / ".gitignore").write_text("/artifacts/\n")
    _git(r, "init", "-q")
    _git(r, "add", ".")
    _git(r, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "init")
    return r


def test_run_id_clean_dirty_and_ignored(repo):
    sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    assert run_id(repo) == sha
    (repo / "artifacts" / "runner").mkdir(parents=True)
    (repo / "artifacts" / "runner" / "manifest.json").write_text("{}")
    assert run_id(repo) == sha  # ignored files never count: running does not dirty the id
    (repo / "nsa_core" / "a.py").write_text("x = 2\n")
    dirty = run_id(repo)
    assert dirty.startswith(f"{sha}-dirty-") and run_id(repo) == dirty  # stable while the diff is
    (repo / "nsa_core" / "a.py").write_text("x = 3\n")
    assert run_id(repo) != dirty  # a different diff, a different id
    (repo / "nsa_core" / "a.py").write_text("x = 1\n")
    assert run_id(repo) == sha
    (repo / "new.py").write_text("y = 1\n")  # untracked, not ignored: counts
    untracked = run_id(repo)
    assert untracked.startswith(f"{sha}-dirty-")
    (repo / "new.py").write_text("y = 2\n")
    assert run_id(repo) != untracked


def test_run_id_outside_git_is_stable(tmp_path):
    (tmp_path / "nsa_core").mkdir()
    (tmp_path / "nsa_core" / "a.py").write_text("x = 1\n")
    rid = run_id(tmp_path)
    assert rid.startswith("nogit-") and run_id(tmp_path) == rid
    (tmp_path / "nsa_core" / "a.py").write_text("x = 2\n")
    assert run_id(tmp_path) != rid


def test_new_run_folder_never_reuses(tmp_path):
    a, b, c = (new_run_folder(tmp_path, "abc") for _ in range(3))
    assert [a.name, b.name, c.name] == ["abc", "abc.2", "abc.3"]


@pytest.mark.parametrize("text, needle", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"schema_version": 2, "run_id": "x", "stages": []}', "schema_version 2 is not supported"),
    ('{"schema_version": 1, "run_id": "x", "stages": [{"name": "a"}]}', "'stages' must be a list"),
    ('{"schema_version": 1, "stages": []}', "'run_id' missing"),
])
def test_load_manifest_rejects_bad_files_clearly(tmp_path, text, needle):
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(ManifestError, match="manifest.json") as e:
        load_manifest(tmp_path)
    assert needle in str(e.value)
    with pytest.raises(ManifestError, match="no manifest.json"):
        load_manifest(tmp_path / "missing")
