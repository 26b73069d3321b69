"""The torchft side of ``bench/recovery.py``: the same megatron model and global batch, trained
by two torchft replica groups (one process each, gloo), one of them SIGKILLed and restarted.

``measure(base, out)`` starts a torchft lighthouse here and two replica processes (this file
run as a script), waits for a few committed steps, SIGKILLs replica 1, restarts it at once and
lets both run on. Every replica logs one JSON line per step (time, torchft step, committed,
the sample ids it trained) and one per heal (bytes received, seconds). Returned figures:
fault-free step time (both replicas alive), kill -> the survivor's next commit, restart -> the
restarted replica's first commit, heal bandwidth, and the samples lost: each replica trains
its own half of every step's global batch (torchft's data-parallel contract), so the half of a
dead replica is never trained by anyone.

Timeouts are those of the ftkit run it is compared with: the manager's ``timeout`` (collectives,
commit vote, checkpoint transfer) is ftkit's ``collective_timeout``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

STEPS_BEFORE_KILL = 6
STEPS_AFTER_HEAL = 4


def measure(base: dict[str, Any], out: Path) -> dict[str, Any]:
    """Run the scenario and read the replicas' logs (see the module docstring)."""
    from torchft._torchft import LighthouseServer

    timeout = float(base.get("collective_timeout") or 10.0)
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=100)
    logs = [out / "torchft-r0.jsonl", out / "torchft-r1.jsonl"]
    args = (lighthouse.address(), json.dumps(base), str(timeout))
    procs = [_spawn(i, logs[i], *args) for i in range(2)]
    try:
        _wait(lambda: all(_committed(f) >= STEPS_BEFORE_KILL for f in logs), procs, "replicas to commit")
        t_kill = time.time()
        os.kill(procs[1].pid, signal.SIGKILL)
        procs[1].wait()
        t_restart = time.time()
        procs[1] = _spawn(1, logs[1], *args)
        _wait(lambda: _committed(logs[1], after=t_restart) >= STEPS_AFTER_HEAL, procs, "the restarted replica")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        lighthouse.shutdown()
    r0, r1 = (_read(f) for f in logs)
    both = [r for r in r0 if r["kind"] == "step" and r["committed"] and r["time"] < t_kill and r["participants"] == 2]
    durations = sorted(r["seconds"] for r in both[1:])
    survivor = next(r for r in r0 if r["kind"] == "step" and r["committed"] and r["time"] > t_kill)
    restarted = next(r for r in r1 if r["kind"] == "step" and r["committed"] and r["time"] > t_restart)
    heal = next((r for r in r1 if r["kind"] == "heal" and r["time"] > t_restart), None)
    last = max(r["step"] for r in r0 + r1 if r["kind"] == "step" and r["committed"])
    trained = {i for r in r0 + r1 if r["kind"] == "step" and r["committed"] and r["step"] <= last for i in r["ids"]}
    expected = (last + 1) * int(base["samples_per_rollout"]) // int(base["steps_per_rollout"])
    figures: dict[str, Any] = {
        "step_s": durations[len(durations) // 2],
        "kill_to_next_commit_s": survivor["time"] - t_kill,
        "restart_to_first_commit_s": restarted["time"] - t_restart,
        "kill_to_restarted_commit_s": restarted["time"] - t_kill,
        "samples_lost": expected - len(trained),
        "samples_expected": expected,
        "timeout_s": timeout,
    }
    if heal is not None:
        figures |= {
            "heal_bytes": heal["bytes"],
            "heal_s": heal["seconds"],
            "heal_MBps": heal["bytes"] / heal["seconds"] / 1e6,
        }
    return figures


def _spawn(replica: int, log: Path, lighthouse: str, base: str, timeout: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    cmd = [sys.executable, __file__, str(replica), str(log), lighthouse, base, timeout]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(f"{log}.stderr", "ab"))


def _read(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.endswith("}")]


def _committed(log: Path, after: float = 0.0) -> int:
    return sum(1 for r in _read(log) if r["kind"] == "step" and r["committed"] and r["time"] > after)


def _wait(done: Any, procs: list[subprocess.Popen[bytes]], what: str, limit: float = 900) -> None:
    deadline = time.monotonic() + limit
    while not done():
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError(f"torchft: gave up waiting for {what} (see the .stderr files next to the logs)")
        time.sleep(0.05)


# ----------------------------------------------------------------------------- one replica
def replica(index: int, log_path: Path, lighthouse: str, base: dict[str, Any], timeout: float) -> None:
    """One replica group of one process: train until killed."""
    import torch
    import torch.distributed as dist
    from torchft import Manager, ProcessGroupGloo
    from torchft.checkpointing.http_transport import HTTPTransport

    from ftkit.model.gpt import build_gpt, configure_determinism, init_local_parallel
    from ftkit.model.presets import get_preset
    from ftkit.tasks.addition import PROMPT_LEN
    from ftkit.train.config import TrainConfig
    from ftkit.train.config.run import leaves
    from ftkit.train.plan.run_plan import build_plan

    cfg = TrainConfig(**{k: v for k, v in base.items() if k in leaves()})
    configure_determinism(cfg.compute.threads_per_rank)
    init_local_parallel("cpu")
    torch.manual_seed(cfg.rng.seed)
    model = build_gpt(build_plan(cfg).model, cfg.rng.seed, "cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.objective.lr, weight_decay=0.0, foreach=False)
    params = [p for p in model.parameters() if p.requires_grad]
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 (open until the process is killed)

    class TimedTransport(HTTPTransport[dict[str, Any]]):
        def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
            t0 = time.perf_counter()
            state = super().recv_checkpoint(src_rank, metadata, step, timeout)
            nbytes = _tensor_bytes(state)
            log.write(
                json.dumps({"kind": "heal", "time": time.time(), "bytes": nbytes, "seconds": time.perf_counter() - t0})
                + "\n"
            )
            return state

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=timeout)),
        load_state_dict=lambda sd: (model.load_state_dict(sd["model"]), opt.load_state_dict(sd["optim"])),
        state_dict=lambda: {"model": model.state_dict(), "optim": opt.state_dict()},
        min_replica_size=1,
        timeout=timedelta(seconds=timeout),
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=lighthouse,
        replica_id=f"replica{index}",
        checkpoint_transport=TimedTransport(timeout=timedelta(seconds=timeout), num_chunks=0),
    )
    preset = get_preset(cfg.model.preset)
    step_samples, seq = cfg.batch.step_samples, PROMPT_LEN + cfg.task.response_len  # ftkit's sample length
    position_ids = torch.arange(seq).unsqueeze(0)
    while True:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        manager.start_quorum()
        step = manager.current_step()
        half = step_samples // 2
        ids = list(range(step * step_samples + index * half, step * step_samples + (index + 1) * half))
        gen = torch.Generator().manual_seed(cfg.rng.seed * 1_000_003 + step * 2 + index)
        tokens = torch.randint(0, preset.vocab_size, (half, seq + 1), generator=gen)
        loss = model(tokens[:, :-1], position_ids, None, labels=tokens[:, 1:]).float().mean()
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        manager.allreduce(flat).wait()
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
            offset += p.numel()
        committed = manager.should_commit()
        if committed:
            opt.step()
        record = {"kind": "step", "time": time.time(), "step": step, "committed": committed, "ids": ids}
        record |= {"seconds": time.perf_counter() - t0, "participants": manager.num_participants()}
        log.write(json.dumps(record) + "\n")


def _tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor in a nested state dict."""
    import torch

    if torch.is_tensor(obj):
        return int(obj.numel() * obj.element_size())
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


if __name__ == "__main__":
    replica(int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]), float(sys.argv[5]))
