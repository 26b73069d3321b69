"""What a fault costs a run, and what the fault-tolerance machinery costs a run without one.

Runs ``ftkit train`` (``run_training`` in a child process per run, each with its own local
Ray; ``small`` model, 2 cells by default) and reads the run's event log:

* ``kill``: rank 0 of cell 1 is SIGKILLed inside the cross-cell reduction of the second step
  of rollout 1 (``--inject kind=sigkill,point=during_reduce``). Printed: kill -> the
  survivor's next committed step; detection (the driver's ``cell_state`` -> ``failed``)
  against the configured ``--collective-timeout``; kill -> the restarted cell's first commit;
  the heal's bytes, seconds and bandwidth, divided by a loopback TCP socket copy of the same
  bytes measured here, in the same run (target >= 0.5): ``transfer_over_loopback`` for the
  stream itself (the heal's ``fetch`` phase), ``heal_over_loopback`` for the whole heal
  (rendezvous, stream, decode, load, fingerprint check); samples lost (the analyzer's
  recovery table; must be 0). The heal's own run is one sample on a noisy machine, so the
  heal stream is also timed against the loopback copy in 5 interleaved pairs of the same
  bytes (``stream_over_loopback_interleaved``, the median ratio).
* ``--node-loss``: a real two-node Ray cluster on this machine (``ftkit.testing.ray_cluster``:
  a head with 0 CPUs and two worker nodes of ``--node-cpus`` CPUs), ``ftkit train
  --ray-address`` with 3 cells (spread 2 + 1), and the raylet of the node holding one cell
  SIGKILLed once cell 0 committed the first step of rollout 1. Printed: kill -> the driver's
  ``failed`` (detection), kill -> the survivors' next commit, kill -> back to the full number
  of cells (the first membership with every cell again: the lost cell healed onto the
  remaining node) and the reconfigures it took.
* ``steps/s`` of fault-free runs: the machinery with nothing injected, with an injector armed
  at every rank (a spec that never fires), and, with ``--baseline`` (a checkout, or a git
  revision checked out in a temporary worktree: e.g. ``6a38ec1``, the last commit before
  fault tolerance, or the previous commit), the baseline's code; runs are interleaved
  ``--repeats`` times and the median of the pairwise ratios is printed (target: machinery /
  previous >= 0.97). Options the baseline does not know are left at its defaults.
* ``--torchft``: the same measurements for torchft (``bench/torchft_peer.py``) on the same
  megatron model, batch and timeouts, where ``pip install ftkit[bench]`` installed it; ratios
  ftkit / torchft. Without torchft the output says so.

    python bench/recovery.py                      # small model, 2 cells
    python bench/recovery.py --model tiny --repeats 1 --json
    python bench/recovery.py --baseline 6a38ec1 --torchft   # vs the commit before fault tolerance
    python bench/recovery.py --model tiny --repeats 1 --node-loss
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Runs older checkouts too (--baseline): options they do not know are dropped (their
# defaults apply), and a step result without ``committed`` was committed.
CHILD = """
import json, sys
from ftkit.train.config import TrainConfig
from ftkit.train.control.driver import run_training
try:
    from ftkit.train.plan.run_plan import build_plan
except ImportError:  # an older checkout: run_training takes the config itself
    build_plan = lambda cfg: cfg
values = {k: v for k, v in json.loads(sys.argv[1]).items() if k in TrainConfig.model_fields}
steps = []
run_training(build_plan(TrainConfig(**values)),
             on_step=lambda r: steps.append([r.rollout, r.step, r.seconds, getattr(r, "committed", True)]))
print("RESULT " + json.dumps(steps))
"""


def train(values: dict[str, Any], tree: Path = ROOT) -> list[list[Any]]:
    """One ``run_training`` of ``values`` in a child process importing ftkit from ``tree``;
    returns ``[rollout, step, seconds, committed]`` per step."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    res = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(values)], capture_output=True, text=True, env=env, timeout=1800
    )
    lines = [line for line in res.stdout.splitlines() if line.startswith("RESULT ")]
    if res.returncode != 0 or not lines:
        raise SystemExit(f"run {values.get('out')} failed (exit {res.returncode}):\n{res.stderr[-3000:]}")
    steps: list[list[Any]] = json.loads(lines[-1][7:])
    return steps


def rate(steps: list[list[Any]]) -> float:
    """Committed steps per second of step time, rollout 0 (warm-up) excluded."""
    timed = [s[2] for s in steps if s[0] > 0 and s[3]]
    return len(timed) / sum(timed)


def events(run: Path) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for f in sorted((run / "events").glob("*.jsonl")):
        found += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return sorted(found, key=lambda e: e["time"])


def loopback_copy(nbytes: int) -> float:
    """Seconds to send ``nbytes`` through a loopback TCP connection into a preallocated buffer."""
    payload = memoryview(bytearray(os.urandom(1 << 20)) * max(1, nbytes >> 20))[:nbytes]
    sink = bytearray(len(payload))
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def send() -> None:
        with socket.create_connection(("127.0.0.1", port)) as c:
            c.sendall(payload)

    t0 = time.perf_counter()
    sender = threading.Thread(target=send)
    sender.start()
    conn, _ = server.accept()
    view, got = memoryview(sink), 0
    while got < len(sink):
        n = conn.recv_into(view[got:])
        if not n:
            break
        got += n
    seconds = time.perf_counter() - t0
    sender.join()
    conn.close()
    server.close()
    return seconds


def stream_copy(nbytes: int) -> float:
    """Seconds the heal stream (``ftkit.train.rank.heal_stream``: TCPStore rendezvous, header, the
    bytes into a preallocated, touched buffer as a heal's parameters and moments are, trailer)
    takes for the bytes of one ``nbytes`` storage between two threads, like ``loopback_copy``:
    its ``fetch`` phase."""
    import datetime

    import torch
    import torch.distributed as dist

    from ftkit.train.rank import heal_stream

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(60))
    payload = {"storage/0": torch.randint(0, 255, (nbytes,), dtype=torch.uint8)}
    sink = torch.zeros(nbytes, dtype=torch.uint8)  # touched, like the heal's room and the loopback's sink
    donor = threading.Thread(target=heal_stream.serve, args=(store, "bench", payload, {}, lambda: "0", 60.0))
    donor.start()
    seconds = heal_stream.receive(store, "bench", 60.0, lambda meta, name, n: sink)[3]["fetch"]
    donor.join()
    return seconds


def stream_vs_loopback(nbytes: int, repeats: int = 5) -> dict[str, float]:
    """The heal stream against ``loopback_copy`` of the same bytes, interleaved ``repeats``
    times (a noisy machine hits both alike): the median of the per-pair ratios."""
    pairs = [(loopback_copy(nbytes), stream_copy(nbytes)) for _ in range(repeats)]
    return {
        "stream_pair_MBps": nbytes / statistics.median(s for _, s in pairs) / 1e6,
        "stream_over_loopback_interleaved": statistics.median(lo / s for lo, s in pairs),
    }


def kill_run(base: dict[str, Any], out: Path) -> dict[str, Any]:
    """The ``kill`` measurements (see the module docstring)."""
    step = base["steps_per_rollout"] + 1
    spec = f"kind=sigkill,point=during_reduce,cell=1,step={step}"
    run = out / "kill"
    train({**base, "out": str(run), "inject": [spec]})
    evs = events(run)
    fault = next(e for e in evs if e["type"] == "fault_injected")
    t = fault["time"]
    detected = next(
        e for e in evs if e["type"] == "cell_state" and e["cell"] == 1 and e["new"] == "failed" and e["time"] >= t
    )
    commits = [e for e in evs if e["type"] == "step_outcome" and e["outcome"] == "committed" and e["time"] > t]
    survivor = next(e for e in commits if e["cell"] == 0)
    healed = next((e for e in commits if e["cell"] == 1), None)
    heal = next((e for e in evs if e["type"] == "heal" and e["cell"] == 1), None)
    from ftkit.analysis.engine import analyze_paths

    rows = analyze_paths([run / "events"]).recovery
    result: dict[str, Any] = {
        "kill_to_next_commit_s": survivor["time"] - t,
        "detect_s": detected["time"] - t,
        "collective_timeout_s": base.get("collective_timeout"),
        "kill_to_restarted_commit_s": None if healed is None else healed["time"] - t,
        "samples_lost": sum(r.get("samples_lost") or 0 for r in rows),
        "recovery_rows": len(rows),
    }
    if heal is not None:
        nbytes, seconds = heal["bytes"], heal["seconds"]["total"]
        # the transfer: the stream's bytes (phase "fetch"), as the loopback copy measures them
        transfer = heal["seconds"].get("fetch", seconds)
        loop = min(loopback_copy(nbytes) for _ in range(3))
        result |= {
            "heal_bytes": nbytes,
            "heal_s": seconds,
            "heal_phases_s": heal["seconds"],
            "heal_MBps": nbytes / seconds / 1e6,
            "heal_transfer_MBps": nbytes / transfer / 1e6,
            "loopback_MBps": nbytes / loop / 1e6,
            "heal_over_loopback": loop / seconds,
            "transfer_over_loopback": loop / transfer,
        }
        result |= stream_vs_loopback(nbytes)
    return result


def node_loss_run(base: dict[str, Any], out: Path, node_cpus: float) -> dict[str, Any]:
    """The ``--node-loss`` measurements (see the module docstring)."""
    from ftkit.testing.ray_cluster import kill_raylet, node_cluster

    cfg = {**base, "cells": 3, "micro_shards": 3, "samples_per_rollout": 24, "collective_timeout": 5.0}
    args = [f"--{k.replace('_', '-')}={v}" for k, v in cfg.items() if k != "out"]
    run = out / "node-loss"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with node_cluster([node_cpus, node_cpus]) as (cluster, nodes):
        cmd = [sys.executable, "-m", "ftkit", "train", "--ray-address", cluster.address, "--out", str(run), *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        first = cfg["steps_per_rollout"]
        while not any(e["type"] == "state_fingerprint" and e["step"] >= first for e in _events_so_far(run)):
            if proc.poll() is not None:
                raise SystemExit(f"node-loss run failed (exit {proc.returncode}):\n{proc.stderr.read()[-3000:]}")
            time.sleep(0.1)
        cells_on: dict[str, set[int]] = {}
        for e in _events_so_far(run):
            if e["type"] == "placement" and e["role"] == "trainer":
                cells_on.setdefault(e["node_id"], set()).add(e["cell"])
        victim = min(cells_on, key=lambda n: len(cells_on[n]))
        t = time.time()
        kill_raylet(next(n for n in nodes if n.node_id == victim))
        _, stderr = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"node-loss run failed (exit {proc.returncode}):\n{stderr[-3000:]}")
    evs = [e for e in events(run) if e["time"] >= t]
    detected = next(e for e in evs if e["type"] == "cell_state" and e["new"] == "failed")
    survivor = next(e for e in evs if e["type"] == "step_outcome" and e["outcome"] == "committed")
    reconfigures = [e for e in evs if e["type"] == "reconfigure"]
    full = next((e for e in reconfigures if len(e["alive_after"]) == cfg["cells"]), None)
    return {
        "node_loss_cells": cfg["cells"],
        "node_cpus": node_cpus,
        "node_cells_lost": len(cells_on[victim]),
        "node_kill_to_detect_s": detected["time"] - t,
        "node_kill_to_next_commit_s": survivor["time"] - t,
        "node_kill_to_full_cells_s": None if full is None else full["time"] - t,
        "node_reconfigures_to_full": None if full is None else reconfigures.index(full) + 1,
    }


def _events_so_far(run: Path) -> list[dict[str, Any]]:
    """``events(run)`` of a run still writing: empty while a line is torn (read again later)."""
    try:
        return events(run) if (run / "events").is_dir() else []
    except ValueError:
        return []


def overhead(base: dict[str, Any], out: Path, repeats: int, baseline: Path | None) -> dict[str, Any]:
    """Fault-free steps/s: machinery, machinery + an armed injector, and the previous code."""
    # Any spec makes every rank and engine build a FaultInjector; these sit at every step point
    # of both cells (so each at() call scans a list) and never fire (attempt 99 never comes).
    never = [
        f"kind=slow,point={p},cell={c},step=0,attempt=99"
        for c in range(base["cells"])
        for p in ("before_forward", "mid_backward", "before_reduce", "during_reduce", "after_reduce")
    ]
    variants: dict[str, tuple[dict[str, Any], Path]] = {
        "machinery": ({}, ROOT),
        "armed_injector": ({"inject": never}, ROOT),
    }
    if baseline is not None:
        variants["previous"] = ({}, baseline)
    rates: dict[str, list[float]] = {k: [] for k in variants}
    for i in range(repeats):
        order = list(variants) if i % 2 == 0 else list(reversed(variants))
        for name in order:
            extra, tree = variants[name]
            run = out / f"{name}-{i}"
            rates[name].append(rate(train({**base, **extra, "out": str(run), "overwrite": True}, tree)))
            print(f"  {name} #{i}: {rates[name][-1]:.3f} steps/s", file=sys.stderr)
    result: dict[str, Any] = {f"{k}_steps_per_s": statistics.median(v) for k, v in rates.items()}
    for other in ("armed_injector", "previous"):
        if other in rates:
            pairs = [a / b for a, b in zip(rates["machinery"], rates[other])]
            result[f"machinery_over_{other}"] = statistics.median(pairs)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small", choices=["tiny", "small"])
    ap.add_argument("--cells", type=int, default=2)
    ap.add_argument("--rollouts", type=int, default=4, help="rollouts of the fault-free runs")
    ap.add_argument("--kill-rollouts", type=int, default=8, help="rollouts of the kill run (time to heal)")
    ap.add_argument("--samples-per-rollout", type=int, default=32)
    ap.add_argument("--micro-shards", type=int, default=2)
    ap.add_argument("--collective-timeout", type=float, default=None, help="default: ftkit's")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved fault-free runs per variant")
    ap.add_argument(
        "--baseline",
        default=None,
        help="the code to compare fault-free steps/s with: a checkout's path, or a git revision of this "
        "repository (checked out in a temporary worktree, removed afterwards)",
    )
    ap.add_argument("--torchft", action="store_true", help="also measure torchft (bench/torchft_peer.py)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--node-loss", action="store_true", help="also lose a node of a two-node Ray cluster")
    ap.add_argument("--node-cpus", type=float, default=2.0, help="CPUs of each worker node (--node-loss)")
    ap.add_argument("--only-node-loss", action="store_true", help="measure the node loss only")
    ap.add_argument("--only-kill", action="store_true", help="measure the kill run only (no fault-free runs)")
    args = ap.parse_args(argv)
    base: dict[str, Any] = {
        "model": args.model,
        "cells": args.cells,
        "rollouts": args.rollouts,
        "steps_per_rollout": 2,
        "samples_per_rollout": args.samples_per_rollout,
        "micro_shards": args.micro_shards,
        "group_size": 4,
        "reward": "deterministic_random",
        "dump_rollouts": "none",
        # no checkpoints: they write the whole state at every rollout's end and older code (a
        # --baseline from before checkpoints) has none; this measures fault tolerance alone
        "checkpoint_every": 0,
    }
    if args.collective_timeout is not None:
        base["collective_timeout"] = args.collective_timeout
    from ftkit.train.config import TrainConfig

    cfg = TrainConfig(**base)
    base.setdefault("collective_timeout", getattr(cfg, "collective_timeout", None))
    figures: dict[str, Any] = {"config": base}
    with tempfile.TemporaryDirectory(prefix="ftkit-recovery-") as tmp:
        figures["ftkit"] = {}
        if not args.only_node_loss:
            print("kill run ...", file=sys.stderr)
            figures["ftkit"] |= kill_run({**base, "rollouts": args.kill_rollouts}, Path(tmp))
        if not (args.only_node_loss or args.only_kill):
            print("fault-free runs ...", file=sys.stderr)
            with baseline_tree(args.baseline, Path(tmp)) as tree:
                figures["ftkit"] |= overhead(base, Path(tmp), args.repeats, tree)
                if args.baseline is not None:
                    figures["config"]["baseline"] = args.baseline
        if args.node_loss or args.only_node_loss:
            print("node-loss run ...", file=sys.stderr)
            figures["ftkit"] |= node_loss_run({**base, "rollouts": args.kill_rollouts}, Path(tmp), args.node_cpus)
        if args.torchft:
            figures["torchft"] = torchft_figures(base, Path(tmp))
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(render(figures))
    return 0


@contextlib.contextmanager
def baseline_tree(baseline: str | None, tmp: Path) -> Iterator[Path | None]:
    """``baseline`` as a directory to import ftkit from: a path as is, a git revision checked
    out (detached) in a temporary worktree under ``tmp``, removed on exit."""
    if baseline is None or Path(baseline).is_dir():
        yield None if baseline is None else Path(baseline)
        return
    tree = tmp / "baseline"
    git = ["git", "-C", str(ROOT)]
    subprocess.run([*git, "worktree", "add", "--detach", str(tree), baseline], check=True, capture_output=True)
    try:
        yield tree
    finally:
        subprocess.run([*git, "worktree", "remove", "--force", str(tree)], capture_output=True)


def torchft_figures(base: dict[str, Any], out: Path) -> dict[str, Any]:
    """torchft's figures on the same model and batch, or why there are none."""
    try:
        import torchft  # noqa: F401
    except ImportError as exc:
        return {"error": f"torchft is not installed ({exc}); pip install 'ftkit[bench]'"}
    sys.path.insert(0, str(Path(__file__).parent))
    from torchft_peer import measure

    return measure(base, out)


def render(f: dict[str, Any]) -> str:
    ft = f["ftkit"]
    lines = [f"config: {json.dumps(f['config'])}", "", "ftkit:"]
    lines += [f"  {k:32s} {_fmt(v)}" for k, v in ft.items() if k != "heal_phases_s"]
    tf = f.get("torchft")
    if tf is not None:
        lines += ["", "torchft:"]
        lines += [f"  {k:32s} {_fmt(v)}" for k, v in tf.items()]
        if "error" not in tf:
            ours = {**ft, "step_s": 1 / ft["machinery_steps_per_s"]}
            lines += ["", "ftkit / torchft (below 1: ftkit is faster):"]
            for key in ("step_s", "kill_to_next_commit_s", "kill_to_restarted_commit_s"):
                if ours.get(key) is not None and tf.get(key):
                    lines.append(f"  {key:32s} {ours[key] / tf[key]:.3f}")
            if ours.get("heal_MBps") and tf.get("heal_MBps"):
                lines.append(f"  {'heal bandwidth (above 1: faster)':32s} {ours['heal_MBps'] / tf['heal_MBps']:.3f}")
            lines.append(f"  samples lost: ftkit {ft['samples_lost']}, torchft {tf.get('samples_lost')}")
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


if __name__ == "__main__":
    sys.exit(main())
