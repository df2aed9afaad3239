"""Atomic writers (DESIGN §6): a write that fails half-way leaves the earlier file intact and no
temporary file behind.

The faults are injected where a real crash happens, after bytes have reached the disk:
- the file system refuses more bytes mid-write (RLIMIT_FSIZE: the kernel lets the first bytes
  through, then write() fails with EFBIG, as a full disk does with ENOSPC);
- the final rename fails (``os.replace`` raises);
- the write is interrupted (KeyboardInterrupt raised from fsync, after every byte was written).
A plain ``path.write_bytes`` (truncate, then write in place) loses the earlier file in the first
case and cannot fail in the other two, so each test here fails for it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal

import pytest

from nsa_runner import artifacts
from nsa_runner.artifacts import write_bytes, write_csv, write_json, write_text

OLD = "the earlier, complete version\n"
NEW = "x" * 200_000  # larger than any buffer, so it is written in several pieces


@pytest.fixture
def earlier(tmp_path):
    p = tmp_path / "out" / "result.txt"
    p.parent.mkdir()
    p.write_text(OLD)
    return p


def _left(folder):
    return sorted(os.listdir(folder))


@contextlib.contextmanager
def disk_full_after(n: int):
    """The kernel refuses file bytes past offset ``n`` (write() -> EFBIG; SIGXFSZ ignored).

    Process-wide, so it is held only around the one write under test.
    """
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (n, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)


def test_disk_refusing_bytes_mid_write_keeps_the_earlier_file(earlier):
    # the first 64 KiB of the new data are written, then the disk "fills up"
    with pytest.raises(OSError) as info, disk_full_after(65536):
        write_text(earlier, NEW)
    assert info.value.errno == errno.EFBIG
    assert earlier.read_text() == OLD
    assert _left(earlier.parent) == ["result.txt"]  # no temporary file left behind


@pytest.mark.parametrize("writer,data", [
    (write_text, NEW),
    (write_bytes, NEW.encode()),
    (write_json, {"values": list(range(50_000))}),
    (write_csv, [{"a": i, "b": "y" * 20} for i in range(10_000)]),
], ids=["text", "bytes", "json", "csv"])
def test_failed_rename_keeps_the_earlier_file(earlier, monkeypatch, writer, data):
    calls = []

    def failing_replace(src, dst):
        calls.append(os.path.getsize(src))  # everything was written to the temporary file ...
        raise OSError(5, "Input/output error (injected)")  # ... and then the rename fails

    monkeypatch.setattr(artifacts.os, "replace", failing_replace)
    with pytest.raises(OSError, match="injected"):
        writer(earlier, data)
    assert calls and calls[0] > 1000
    assert earlier.read_text() == OLD
    assert _left(earlier.parent) == ["result.txt"]


def test_interrupt_after_the_bytes_keeps_the_earlier_file(earlier, monkeypatch):
    """Ctrl-C between writing and renaming: BaseException, not only Exception, cleans up."""
    seen = []

    def interrupted_fsync(fd):
        seen.append(os.fstat(fd).st_size)
        raise KeyboardInterrupt

    monkeypatch.setattr(artifacts.os, "fsync", interrupted_fsync)
    with pytest.raises(KeyboardInterrupt):
        write_text(earlier, NEW)
    assert seen == [len(NEW)]
    assert earlier.read_text() == OLD
    assert _left(earlier.parent) == ["result.txt"]


def test_a_successful_write_replaces_the_file_and_leaves_nothing_else(earlier):
    write_text(earlier, NEW)
    assert earlier.read_text() == NEW
    assert _left(earlier.parent) == ["result.txt"]
    assert (earlier.stat().st_mode & 0o777) == 0o644  # readable like a normal file, not mkstemp's 0600
