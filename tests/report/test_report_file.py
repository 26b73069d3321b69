"""Side reports (--junit-xml, --html) are written where the user pointed them: regular files
atomically, through a symbolic link to its file (the link stays), special files in place (a
FIFO, /dev/null, /dev/stdout are never renamed over), and a failing write is exit 2."""

from __future__ import annotations

import errno
import os
import stat
import threading
from pathlib import Path

import pytest

from ftkit.errors import UsageError
from ftkit.report.report_file import write_report_file


def test_a_regular_file_is_replaced_whole_and_no_temporary_is_left(tmp_path: Path) -> None:
    target = tmp_path / "r.xml"
    target.write_bytes(b"old report, longer than the new one")
    write_report_file(target, b"new")
    assert target.read_bytes() == b"new" and os.listdir(tmp_path) == ["r.xml"]


def test_a_link_keeps_being_a_link_and_its_file_gets_the_report(tmp_path: Path) -> None:
    (tmp_path / "real.html").write_bytes(b"old")
    link = tmp_path / "report.html"
    link.symlink_to("real.html")
    write_report_file(link, b"new")
    assert link.is_symlink() and (tmp_path / "real.html").read_bytes() == b"new"


def test_a_link_to_a_device_writes_through_it(tmp_path: Path) -> None:
    link = tmp_path / "null"
    link.symlink_to(os.devnull)
    write_report_file(link, b"discarded")
    assert link.is_symlink() and stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_a_fifo_is_written_through_and_stays_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_report_file(fifo, b"<testsuites/>")
    reader.join(timeout=30)
    assert got == [b"<testsuites/>"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_failing_write_is_exit_2_naming_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk (here: the fsync fails, as it does when the data cannot be stored) keeps the old
    report and leaves no temporary file."""
    import ftkit.fsutil

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    (tmp_path / "r.html").write_bytes(b"old")
    monkeypatch.setattr(ftkit.fsutil.os, "fsync", full)
    with pytest.raises(UsageError) as err:
        write_report_file(tmp_path / "r.html", b"x")
    assert err.value.exit_code == 2 and "r.html" in err.value.message and "No space left" in err.value.message
    assert os.listdir(tmp_path) == ["r.html"] and (tmp_path / "r.html").read_bytes() == b"old"
