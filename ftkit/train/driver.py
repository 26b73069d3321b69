"""The driver of ``ftkit train``: the run directory, Ray, the cells, the engines and the loop.

``run_training(cfg, on_step)`` runs one training run to the end and returns a ``RunResult``
(with the analyzer's verdict over the run's own event log). In order:

1. checks that fail fast, before anything is written: the device, the run directory
   (``cfg.out``; an existing one only with ``overwrite``, and only if it is an ftkit run
   directory or empty), Ray (an existing connection is reused; else ``cfg.ray_address`` is
   joined, or a local instance with ``LOCAL_RAY_CPUS`` logical CPUs is started, and shut
   down at the end) and whether its resources hold the cells and engines;
2. the run directory, ``run.json`` (config, ftkit version, layout, seed), the driver's
   ``EventWriter`` and ``run_started``; from here on ``run_finished`` always ends the log;
3. a ``TCPStore`` hosted here, on this node's Ray IP and a free port, through which every
   rank builds its cell world and the cross-cell groups;
4. the cells (``ftkit.train.cells``), ``init_cell`` and ``join_cross_cell`` (epoch 0), and the
   engines, which load the initial weights (version 0);
5. per rollout ``r``: prompts -> engines generate -> rewards -> advantages ->
   ``witness_allocated`` -> ``rollouts/rollout_r.safetensors`` -> ``steps_per_rollout``
   optimizer steps (micro-shards assigned by ``microshards.assign`` over the alive cells,
   ``train_step`` on every rank of every cell in parallel) with a ``metric`` per step and
   per rollout -> weights version ``r+1`` exported by the first live cell, fingerprinted
   (``weights_sent``) and loaded by every engine (``engine_weights``);
6. the final state (``save_final`` on the first live cell), ``run_finished``, shutdown;
7. ``analyze_paths`` over ``events/``.

Weights version ``v`` is the state after ``v`` rollouts; it is sent with ``rollout = v``,
the rollout it generates (version ``rollouts`` is the final state, generating nothing).
A step that does not commit on every cell is not retried here (fault handling is not part of
this driver): it is reported and the run goes on, so the analyzer finds the samples that
were never trained.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftkit import __version__
from ftkit.errors import ConfigError
from ftkit.train.config import TrainConfig

#: Logical CPUs of the local Ray instance (more than the cores: actors ask for fractions).
LOCAL_RAY_CPUS = 8
STORE_TIMEOUT = datetime.timedelta(seconds=300)


@dataclass
class StepReport:
    """What the driver knows after one optimizer step (for live progress)."""

    rollout: int
    rollouts: int
    step: int
    steps: int
    committed: bool
    loss: float
    grad_norm: float
    reward: float
    tokens_per_s: float
    seconds: float
    cells_alive: int
    cells: int


@dataclass
class RunResult:
    """The outcome of ``run_training``."""

    run_dir: Path
    run: str
    steps_committed: int
    steps_total: int
    seconds: float
    final_files: list[str]
    rewards: list[float] = field(default_factory=list)  # mean reward per rollout
    engine_totals: list[list[str]] = field(default_factory=list)  # per version, per engine
    analysis: Any = None  # ftkit.analysis.engine result


def connect_ray(cfg: TrainConfig) -> bool:
    """Make sure Ray is initialised; returns whether this call did it (and must shut it down)."""
    import ray

    if ray.is_initialized():
        return False
    quiet: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}  # stderr is for ftkit's progress
    try:
        if cfg.ray_address:
            ray.init(address=cfg.ray_address, **quiet)
        else:
            ray.init(num_cpus=LOCAL_RAY_CPUS, include_dashboard=False, **quiet)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = cfg.ray_address or "a local Ray instance"
        raise ConfigError(
            f"cannot connect to {where}: {exc}".splitlines()[0],
            hint="check the address (ray start --head prints it) or omit --ray-address; a cluster "
            "with token authentication also needs RAY_AUTH_MODE=token here",
        ) from None
    return True


def host_store() -> Any:
    """A ``TCPStore`` server on this node's Ray IP and a free port (``.host``, ``.port``)."""
    import ray
    import torch.distributed as dist

    host = ray.util.get_node_ip_address()
    return dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=STORE_TIMEOUT)


class Driver:
    """One run (see the module docstring); use ``run_training``."""

    def __init__(self, cfg: TrainConfig, on_step: Callable[[StepReport], None] | None = None) -> None:
        from ftkit.train.task import AdditionTask

        self.cfg = cfg
        self.on_step = on_step or (lambda report: None)
        try:
            self.task = AdditionTask(cfg.response_len)
        except ValueError as exc:
            raise ConfigError(str(exc), hint="raise --response-len (config: response_len)") from None
        self.cells: list[Any] = []
        self.cell_status: dict[int, str] = {}
        self.engines: list[Any] = []
        self.engine_totals: list[list[str]] = []
        self.rewards: list[float] = []
        self.steps_committed = 0

    # --- the run ----------------------------------------------------------------------
    def run(self) -> RunResult:
        from ftkit.events.writer import EventWriter
        from ftkit.train.cells import check_resources
        from ftkit.train.rundir import check_run_dir, make_run_dir, write_run_json

        cfg, started = self.cfg, time.perf_counter()
        self.device = cfg.resolved_device()
        if self.device == "cuda" and not _cuda_available():
            raise ConfigError(
                "--device cuda, but torch sees no CUDA device here",
                hint="use --device cpu (or auto), or run on a machine with a GPU",
            )
        check_run_dir(cfg.out, cfg.overwrite)
        own_ray = connect_ray(cfg)
        try:
            check_resources(cfg.cells, cfg.tp * cfg.pp, cfg.engines, self.device)
            self.run_dir = make_run_dir(cfg.out, cfg.overwrite).resolve()
            write_run_json(self.run_dir, cfg, self.device, self.task)
            self.events = EventWriter(self.run_dir / "events", run=self.run_dir.name, role="driver")
        except BaseException:
            _disconnect(own_ray)
            raise
        # From here on the run exists: whatever happens, its log says how it ended.
        self.events.emit(
            "run_started",
            config=cfg.model_dump(mode="json"),
            num_cells=cfg.cells,
            tp=cfg.tp,
            pp=cfg.pp,
            num_engines=cfg.engines,
            ftkit_version=__version__,
        )
        status, reason = "failed", None
        try:
            self.store = host_store()
            self._start()
            for rollout in range(cfg.rollouts):
                self._rollout(rollout)
            final = self._save_final()
            status = "completed"
        except KeyboardInterrupt:
            status, reason = "interrupted", "keyboard interrupt"
            raise
        except BaseException as exc:
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
            raise
        finally:
            self._shutdown()
            self.events.emit("run_finished", status=status, reason=reason)
            self.events.close()
            _disconnect(own_ray)
        return RunResult(
            self.run_dir,
            self.run_dir.name,
            self.steps_committed,
            cfg.rollouts * cfg.steps_per_rollout,
            time.perf_counter() - started,
            final,
            self.rewards,
            self.engine_totals,
            analyze(self.run_dir),
        )

    def _start(self) -> None:
        import ray

        from ftkit.train.cells import actor_resources, start_cells
        from ftkit.train.engines import InferenceEngine

        cfg, cfg_dict = self.cfg, self.cfg.model_dump(mode="json")
        indices = list(range(cfg.cells))
        for c in indices:
            self.cell_status[c] = "pending"
            self._cell_state(c, "starting", "run start")
        self.cells = start_cells(cfg_dict, str(self.run_dir), indices, cfg.tp * cfg.pp, self.device)
        res = actor_resources(self.device)
        engine_cls = ray.remote(num_cpus=res["CPU"], num_gpus=res.get("GPU", 0))(InferenceEngine)
        self.engines = [engine_cls.remote(cfg_dict, str(self.run_dir), e) for e in range(cfg.engines)]
        host, port = self.store.host, self.store.port
        ray.get([ref for cell in self.cells for ref in cell.call("init_cell", host, port)])
        self.epoch, self.alive = 0, indices
        ray.get(
            [ref for cell in self.cells for ref in cell.call("join_cross_cell", self.epoch, self.alive, host, port)]
        )
        for c in indices:
            self._cell_state(c, "alive", "joined epoch 0")
        self.events.emit("reconfigure", epoch=self.epoch, alive_before=[], alive_after=self.alive, reason="run start")
        ray.get([e.ready.remote() for e in self.engines])
        self._push_weights(version=0)

    def _rollout(self, rollout: int) -> None:
        import ray

        from ftkit.train import rollouts
        from ftkit.train.microshards import assign
        from ftkit.train.rewards import get_reward

        cfg = self.cfg
        batch = self._generate(rollout)
        rewards = get_reward(cfg.reward)(self.task, batch["prompts"], batch["responses"])
        tensors = rollouts.build_batch(batch["prompts"], batch["responses"], rewards, cfg.group_size, rollout)
        if cfg.bookkeeping:  # without bookkeeping the ranks carry no witness to count with
            self.events.emit(
                "witness_allocated", rollout=rollout, attempt=0, ids=tensors["witness_ids"].tolist(), expected=1
            )
        rollouts.record(
            self.run_dir,
            rollout,
            tensors,
            meta={"task": self.task.name, "reward": cfg.reward, "group_size": str(cfg.group_size)},
        )
        reward = float(rewards.double().mean())
        self.rewards.append(reward)
        self.events.emit("metric", rollout=rollout, step=None, values={"reward": reward})
        batch_ref = ray.put(tensors)
        dump = cfg.dumps_rollout(rollout) and bool(cfg.dump_what)
        for k in range(cfg.steps_per_rollout):
            step = rollout * cfg.steps_per_rollout + k
            shards = assign(cfg.micro_shards, self.alive)
            t0 = time.perf_counter()
            refs = {
                cell.index: cell.call(
                    "train_step",
                    rollout,
                    step,
                    0,
                    self.epoch,
                    batch_ref,
                    shards[cell.index],
                    dump,
                    dump and (cfg.dump_cells == "all" or cell.index == self.alive[0]),
                )
                for cell in self.cells
            }
            results = {c: ray.get(r) for c, r in refs.items()}
            seconds = time.perf_counter() - t0
            self._step_done(rollout, step, results, seconds, reward)
        self._push_weights(version=rollout + 1)

    def _generate(self, rollout: int) -> dict[str, Any]:
        import ray
        import torch

        from ftkit.train.engines import split

        cfg = self.cfg
        prompts = self.task.prompts(cfg.seed, rollout, cfg.samples_per_rollout // cfg.group_size)
        prompts = prompts.repeat_interleave(cfg.group_size, dim=0)
        ranges = split(cfg.samples_per_rollout, len(self.engines))
        refs = [eng.generate.remote(prompts[a:b], rollout, a) for eng, (a, b) in zip(self.engines, ranges) if b > a]
        return {"prompts": prompts, "responses": torch.cat(ray.get(refs), dim=0)}

    def _step_done(
        self, rollout: int, step: int, results: dict[int, list[dict]], seconds: float, reward: float
    ) -> None:
        """Metrics of a step from every rank's result; the step counts as committed only if
        every rank of every cell committed it."""
        cfg = self.cfg
        committed = all(r["committed"] for rs in results.values() for r in rs)
        self.steps_committed += committed
        # Every rank reports the whole step's loss (summed over all micro-shards across
        # cells), grad norm and learned tokens; the first live cell's rank 0 speaks for all.
        first = results[self.alive[0]][0]
        loss, grad_norm, tokens = first["loss"], first["grad_norm"], first["tokens"]
        tps = tokens / seconds if seconds > 0 else 0.0
        self.events.emit(
            "metric",
            rollout=rollout,
            step=step,
            values={"loss": loss, "grad_norm": grad_norm, "tokens_per_s": tps, "step_seconds": seconds},
        )
        self.events.sync()
        self.on_step(
            StepReport(
                rollout,
                cfg.rollouts,
                step,
                cfg.rollouts * cfg.steps_per_rollout,
                committed,
                loss,
                grad_norm,
                reward,
                tps,
                seconds,
                len(self.alive),
                cfg.cells,
            )
        )

    def _push_weights(self, version: int) -> None:
        """Export the first live cell's weights, fingerprint them, load them on every engine."""
        import ray

        from ftkit.tensors.fingerprint import fingerprint_tensors

        first = self._cell(self.alive[0])
        state = ray.get(first.call("export_weights"))[0]
        total, params = fingerprint_tensors(state)
        self.events.emit("weights_sent", rollout=version, version=version, total=total, params=params)
        ref = ray.put(state)
        self.engine_totals.append(ray.get([e.load_weights.remote(ref, version, version) for e in self.engines]))

    def _save_final(self) -> list[str]:
        import ray

        first = self._cell(self.alive[0])
        return sorted(p for paths in ray.get(first.call("save_final", str(self.run_dir))) for p in paths)

    # --- helpers ------------------------------------------------------------------------
    def _cell(self, index: int) -> Any:
        return next(c for c in self.cells if c.index == index)

    def _cell_state(self, cell: int, new: str, reason: str) -> None:
        old, self.cell_status[cell] = self.cell_status[cell], new
        self.events.emit("cell_state", cell=cell, old=old, new=new, reason=reason)

    def _shutdown(self) -> None:
        """Flush every actor's event log, then kill the actors and release the groups."""
        import ray

        refs = [ref for cell in self.cells for ref in cell.call("shutdown")]
        refs += [e.shutdown.remote() for e in self.engines]
        with contextlib.suppress(Exception):  # an actor or group already gone is fine
            ray.get(refs, timeout=60)
        for cell in self.cells:
            cell.kill()
        for c, state in self.cell_status.items():
            if state in ("alive", "starting"):
                self._cell_state(c, "stopped", "run end")
        for e in self.engines:
            with contextlib.suppress(Exception):  # an actor or group already gone is fine
                ray.kill(e, no_restart=True)
        self.cells, self.engines = [], []


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _disconnect(own_ray: bool) -> None:
    """Shut Ray down if this run started (or joined) it."""
    if own_ray:
        import ray

        ray.shutdown()


def analyze(run_dir: Path) -> Any:
    """The analyzer's result over the run's own event log."""
    from ftkit.analysis.engine import analyze_paths

    return analyze_paths([run_dir / "events"])


def run_training(cfg: TrainConfig, on_step: Callable[[StepReport], None] | None = None) -> RunResult:
    """Run ``cfg`` to the end (see the module docstring); raises ``ConfigError`` /
    ``UsageError`` for a bad run directory, Ray address or layout."""
    return Driver(cfg, on_step).run()
