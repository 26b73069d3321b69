"""Without ``--ray-address``, ``ftkit train`` starts a Ray instance of its own, whatever else
runs here: neither a stale ``ray_current_cluster`` file (a cluster that died) nor a live
``ray start --head`` on this machine is joined.

The test gives Ray a private default temp dir (``TMPDIR``), so the file it writes and the
head it starts are seen by the runs of this test only, never by other Ray users of the
machine.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import clusterkit
import pytest

pytestmark = pytest.mark.slow

TINY = ["--cells", "1", "--rollouts", "1", "--steps-per-rollout", "1", "--samples-per-rollout", "8"]
TINY += ["--micro-shards", "1", "--group-size", "4", "--format", "json"]


def _train(out: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "ftkit", "train", "--out", str(out), *TINY]
    return subprocess.run(args, capture_output=True, text=True, timeout=540, env=env)


def test_a_local_run_ignores_a_stale_address_file_and_a_running_head(tmp_path):
    tmp = tempfile.mkdtemp(prefix="ftl", dir="/tmp")  # short: Ray's socket paths must fit
    env = dict(os.environ, TMPDIR=tmp, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    env.pop("RAY_ADDRESS", None)
    current = Path(tmp, "ray", "ray_current_cluster")
    try:
        # 1. a cluster that died and left its address behind: nothing listens there
        current.parent.mkdir()
        current.write_text(f"127.0.0.1:{clusterkit.free_port()}")
        proc = _train(tmp_path / "stale", env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        # 2. a live head on this machine, written to the same default temp dir
        current.unlink()
        with clusterkit.ray_head(env, os.path.join(tmp, "head.log"), cpus=1) as address:
            port = address.rsplit(":", 1)[1]  # the file a plain ray.init() would follow names the head
            assert current.read_text().strip().endswith(f":{port}")
            head_logs = Path(tmp, "ray", "session_latest").resolve() / "logs"
            proc = _train(tmp_path / "head", env)
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert not [p.name for p in head_logs.iterdir() if p.name.startswith("worker-")]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
