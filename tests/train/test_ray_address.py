"""``ftkit train --ray-address`` joins a Ray cluster it did not start: a head node this test
starts on loopback in a subprocess (its own process group and temp dir), stopped in teardown
by killing that process group only.

Head and client both run with token authentication on a token file of the test's own
(``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN_PATH``): since Ray 2.59 ``ray start --head``
turns token auth on by itself whenever ``~/.ray/auth_token`` exists, while a client only
sends the token when ``RAY_AUTH_MODE=token`` is set (ray-project/ray#64755), so pinning both
keeps the test independent of what earlier Ray sessions left in the home directory.
"""

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile

import clusterkit
import pytest


@pytest.fixture
def ray_head():
    temp_dir = tempfile.mkdtemp(prefix="ftr", dir="/tmp")  # short: Ray's socket paths must fit
    token = os.path.join(temp_dir, "auth_token")
    with open(token, "w") as fh:
        fh.write(secrets.token_hex(32))
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token}
    try:
        with clusterkit.ray_head(env, os.path.join(temp_dir, "head.log"), temp_dir) as address:
            yield address, temp_dir, env
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow
def test_train_joins_an_existing_cluster(ray_head, tmp_path):
    address, temp_dir, env = ray_head
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ftkit",
            "train",
            "--ray-address",
            address,
            "--out",
            str(out),
            "--cells",
            "2",
            "--rollouts",
            "1",
            "--steps-per-rollout",
            "1",
            "--samples-per-rollout",
            "8",
            "--micro-shards",
            "2",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=540,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["verdict"] == "pass" and doc["schema_version"] == 1
    assert doc["run"]["steps_committed"] == 1
    assert json.loads((out / "run.json").read_text())["config"]["ray_address"] == address
    # the rank and engine actors ran in the cluster the test started, not in a local instance
    logs = os.path.join(temp_dir, "session_latest", "logs")
    assert any(name.startswith("worker-") for name in os.listdir(logs))
