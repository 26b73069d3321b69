"""A real small file system that fills up: a 1 MiB tmpfs mounted for the test (needs root and
mount rights; skipped with the reason otherwise). Preflight refuses what cannot fit; a disk
filled by someone else between preflight and write gives a real ENOSPC mid-write: rejected with
the reason, nothing half-published, and the next publication succeeds once there is room."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest
from ckpt_helpers import payload

from ftkit.checkpoint.guard import GuardVerdict
from ftkit.checkpoint.preflight import agree, preflight
from ftkit.checkpoint.publish import Publisher
from ftkit.checkpoint.retention import RetentionPolicy
from ftkit.checkpoint.verify import verify_path


@pytest.fixture
def small_fs(tmp_path) -> Path:
    mnt = tmp_path / "small"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a 1 MiB tmpfs here ({proc.stderr.strip() or proc.returncode}); needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def _try(pub: Publisher, step: int, scale: int):  # noqa: ANN202
    p = payload(step, scale=scale)
    gv = GuardVerdict(step - 3, step, False)
    return pub.publish(step, p, gv, agree([preflight(pub.dir, step, p.nbytes, gv, "r0")]), metric=1.0)


def test_preflight_refuses_what_cannot_fit(small_fs) -> None:
    pub = Publisher(small_fs / "checkpoints", RetentionPolicy())
    out = _try(pub, 3, scale=64)  # ~2 MiB of tensors
    assert not out.published and "not enough free space" in out.reason
    assert sorted(p.name for p in pub.dir.iterdir()) == []


def test_disk_filled_after_preflight_real_enospc(small_fs) -> None:
    pub = Publisher(small_fs / "checkpoints", RetentionPolicy(keep_last=1, keep_best=0))
    assert _try(pub, 3, scale=4).published  # ~100 KiB
    before = sorted(p.name for p in pub.dir.iterdir())
    p = payload(7, scale=4)
    gv = GuardVerdict(4, 7, False)
    agreed = agree([preflight(pub.dir, 7, p.nbytes, gv, "r0")])
    assert agreed.ok
    filler = small_fs / "filler"  # another process takes the space between preflight and write
    with open(filler, "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    out = pub.publish(7, p, gv, agreed, metric=1.0)
    assert not out.published and "Errno 28" in out.reason and "No space left on device" in out.reason
    assert sorted(x.name for x in pub.dir.iterdir()) == before  # nothing staged is left
    assert verify_path(pub.dir).findings == []
    os.unlink(filler)
    assert _try(pub, 11, scale=4).published  # training goes on
    assert verify_path(pub.dir).findings == []
