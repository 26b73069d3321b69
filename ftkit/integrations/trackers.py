"""The backends of ``ftkit train --report-to`` (``ftkit.integrations.tracking.Tracker``), one class
each; every one imports its package only when it starts (``import_backend`` checks it before Ray).

- ``tensorboard``: ``torch.utils.tensorboard.SummaryWriter`` in ``RUN/tensorboard/``; the config
  as text (``config``, JSON). A resumed run writes a new event file in the same directory with
  ``purge_step`` at its first step, so TensorBoard drops the earlier session's points from there
  on (the steps trained again after the checkpoint are shown once, as logged last).
- ``wandb``: ``wandb.init`` in ``RUN/`` (``RUN/wandb/``), offline unless ``WANDB_MODE`` says
  otherwise; ``WANDB_PROJECT`` (default ``ftkit``), the run named after the run directory; the
  run's id is kept in ``RUN/tracking.json`` and a resumed run continues it (``resume="allow"``).
  Every scalar is logged with ``global_step`` as its x axis (``define_metric``), so a rollout's
  metric logged after its steps is not dropped as out of order.
- ``mlflow``: ``MlflowClient`` on ``MLFLOW_TRACKING_URI``, default ``file:RUN/mlruns``; experiment
  ``MLFLOW_EXPERIMENT_NAME`` (default ``ftkit``); the config as params (values cut at 6000
  characters); the run id in ``RUN/tracking.json``, a resumed run logs to the same run (its
  params are not logged again: MLflow's params cannot change).
"""

from __future__ import annotations

import importlib
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ftkit.errors import InstallError

MODULE = {"tensorboard": "torch.utils.tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
#: tracker name -> the ftkit extra that installs it (``ftkit.extras.EXTRAS``).
EXTRA = {"tensorboard": "tracking", "wandb": "wandb", "mlflow": "mlflow"}


def import_backend(name: str) -> Any:
    """The backend's module; ``InstallError`` (exit 2, the extra's ``pip install`` hint) when it
    cannot be imported (a broken install as much as a missing one)."""
    try:
        return importlib.import_module(MODULE[name])
    except Exception as exc:  # noqa: BLE001 - ImportError, or whatever a broken package raises
        raise InstallError(
            f"--report-to {name} cannot start: importing {MODULE[name]} failed ({type(exc).__name__}: {exc})",
            f"pip install 'ftkit[{EXTRA[name]}]'",
        ) from None


def _ids(run_dir: Path) -> dict[str, str]:
    try:
        doc = json.loads((run_dir / "tracking.json").read_text())
        return {str(k): str(v) for k, v in doc.items()} if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def _keep_id(run_dir: Path, key: str, value: str) -> None:
    """``RUN/tracking.json[key] = value`` (atomically: a resumed run reads it back)."""
    from ftkit.fsutil import temp_path

    ids = {**_ids(run_dir), key: value}
    tmp = temp_path(run_dir / "tracking.json")
    tmp.write_text(json.dumps(ids, indent=2) + "\n")
    os.replace(tmp, run_dir / "tracking.json")


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir / "tensorboard"
        self.writer: Any = None

    def start(self, config: Mapping[str, Any], first_step: int, resumed: bool) -> None:
        module = import_backend(self.name)
        self.writer = module.SummaryWriter(log_dir=str(self.dir), purge_step=first_step if resumed else None)
        text = json.dumps(dict(config), indent=2, sort_keys=False)
        self.writer.add_text("config", "\n".join("    " + line for line in text.splitlines()), first_step)

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    name = "wandb"

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.run: Any = None

    def start(self, config: Mapping[str, Any], first_step: int, resumed: bool) -> None:
        wandb = import_backend(self.name)
        run_id = _ids(self.run_dir).get("wandb") or wandb.util.generate_id()
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "ftkit"),
            name=self.run_dir.name,
            id=run_id,
            resume="allow",
            dir=str(self.run_dir),
            config=dict(config),
            mode=os.environ.get("WANDB_MODE", "offline"),
        )
        _keep_id(self.run_dir, "wandb", run_id)
        self.run.define_metric("global_step")
        self.run.define_metric("*", step_metric="global_step")

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        self.run.log({**scalars, "global_step": step})

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    name = "mlflow"

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.client: Any = None
        self.run_id = ""

    def start(self, config: Mapping[str, Any], first_step: int, resumed: bool) -> None:
        import_backend(self.name)
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or (self.run_dir / "mlruns").resolve().as_uri()
        self.client = MlflowClient(tracking_uri=uri)
        known = _ids(self.run_dir).get("mlflow")
        if known:
            self.run_id = known
            self.client.update_run(known, status="RUNNING")
            return
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "ftkit")
        found = self.client.get_experiment_by_name(name)
        experiment = found.experiment_id if found is not None else self.client.create_experiment(name)
        self.run_id = self.client.create_run(experiment, run_name=self.run_dir.name).info.run_id
        _keep_id(self.run_dir, "mlflow", self.run_id)
        params = [Param(str(k), (v if isinstance(v, str) else json.dumps(v))[:6000]) for k, v in config.items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in scalars.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


BACKENDS: dict[str, Callable[[Path], Any]] = {
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
    "mlflow": MlflowTracker,
}
