"""Bad days, red-team round 28 U28-7, through the CLI: ``--S-list 99999999999999999999k`` was accepted at parse time;
the stage ran and was ERROR at every point ("Overflow when unpacking long long"), rc 1, while ``--T -5`` is a usage
error. Expected: a size past what any kernel indexes (2**31 - 1) is refused like a negative one: one line naming the
option, exit 2, nothing run."""

from __future__ import annotations

import subprocess

import pytest

try:
    from _bad_days import cli_cmd
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd


@pytest.mark.parametrize("value", ["99999999999999999999k", "2147483648", "4,2097152k"])
def test_a_size_no_kernel_can_index_is_a_usage_error(tmp_path, value):
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("stage", "decode-bench", "--S-list", value, "--out", out, "--device", "cpu"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])  # before: 1, every point ERROR
    lines = r.stderr.splitlines()
    assert lines[0].startswith("error: ") and "--S-list" in lines[0] and "2147483647" in lines[0], lines
    assert not out.exists() or not any(out.iterdir()), sorted(out.rglob("*"))


# round 30 B30-3 / U30-2 / U30-3 / U30-6: the single-integer options had no upper bound (--dk 99999999999 ran and was
# ERROR at run time), Unicode digits and ``_`` were taken, a long value's bad character was cut from the quote, and an
# empty element of a list was dropped. One parser (``stage.whole_number``) for every integer option now.
@pytest.mark.parametrize(("stage", "flag", "value", "said"), [
    ("prefill-bench", "--dk", "99999999999", "2147483647"),
    ("prefill-bench", "--heads", "2147483648", "2147483647"),
    ("selection-map", "--T", "99999999999999999999", "2147483647"),
    ("decode-bench", "--iters", "4294967296", "2147483647"),
    ("prefill-bench", "--iters", "\u0661\u0662", "expected an integer"),
    ("decode-bench", "--warmup", "1_0", "expected an integer"),
    ("selection-map", "--T", "1" * 60 + "x", "'x' at character 61"),
    ("decode-bench", "--S-list", "1k,,2k", "element 2 of 3 is empty"),
    # round 31: the element as typed (U31-3), 5000 digits said as the bound, not Python's advice (U31-4), --seed on
    # ASCII decimal digits like the rest (U31-2)
    ("decode-bench", "--S-list", "2kk", "'2kk'"),
    ("selection-map", "--T", "9" * 5000, "up to 2147483647"),
    ("selection-map", "--seed", "1_2", "decimal digits"),
    # round 32 U32-1: 5000 leading zeros got past the digit count into Python's digit-limit advice
    ("selection-map", "--T", "0" * 5000, "positive integer"),
    ("selection-map", "--seed", "0" * 5000 + "9" * 20, "0..2**63-1"),
])
def test_every_integer_option_is_bounded_and_plain(tmp_path, stage, flag, value, said):
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("stage", stage, flag, value, "--out", out, "--device", "cpu"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])  # before: 1 (run, then ERROR) or 0 (taken)
    lines = r.stderr.splitlines()
    assert lines[0].startswith("error: ") and flag in lines[0] and said in lines[0], lines
    assert not out.exists() or not any(out.iterdir()), sorted(out.rglob("*"))
