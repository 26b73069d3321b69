"""``FtkitCallback``: ftkit's evidence for every Hugging Face ``Trainer`` (and TRL trainer) run.

    from ftkit.integrations.transformers import FtkitCallback
    ftkit_cb = FtkitCallback("runs/hf")                    # default: <output_dir>/ftkit
    trainer = Trainer(model, args, train_dataset=ds, callbacks=[ftkit_cb])
    trainer.train()
    # ftkit analyze-events runs/hf/events; ftkit verify-checkpoint runs/hf

What it logs (``ftkit.evidence.EvidenceRun``, one cell per data-parallel process):

- every optimizer step (``on_step_end``; ftkit step = ``state.global_step - 1``): its outcome and
  the ``state_fingerprint`` of the model and the optimizer's state (every ``fingerprint_every``
  steps), which the analyzer compares across the DDP replicas (FT101);
- the gradients before every optimizer step (``on_pre_optimizer_step``) through the non-finite
  guard (``grad_nonfinite``); the ``Trainer`` still steps (it cannot discard a step), so
  ``analyze-events`` reports each such committed step (FT106: the optimizer stepped on NaN / Inf)
  and the guard refuses the checkpoint of that interval;
- the loss the ``Trainer`` logs (``on_log``, every ``logging_steps``: the promised metric cadence),
  except after a non-finite gradient: the ``Trainer``'s default ``logging_nan_inf_filter`` logs a
  NaN / Inf loss as the mean of the earlier ones, so when the guard saw a non-finite gradient at
  any step since the last log, the callback logs the guard's verdict, ``loss = nan`` (FT109);
- at every ``Trainer`` save (``on_save``, every ``save_steps``) a guarded ftkit checkpoint of the
  model and optimizer state in ``<run>/checkpoints/`` (``EvidenceRun.publish_checkpoint``), which
  ``verify-checkpoint`` checks against the logged fingerprints;
- sample witnesses only with ``collator(...)`` (below): otherwise they are not promised, and
  ``analyze-events`` reports FT103-FT105 as not covered.

Witnesses: give every example a ``sample_id`` (unique within the data set; each epoch
allocates the same ids again), pass
``data_collator=ftkit_cb.collator(base_collator)`` and ``remove_unused_columns=False``. The
collator strips the ids off and queues them per batch; a forward pre-hook takes one batch's ids per
training forward (in order, so the dataloader's prefetching does not matter), and ``on_step_end``
logs the step's global counts (gradient accumulation included). Evaluation through the same
collator during training is refused with witnesses on (its batches would share the queue).
Each epoch is one witness rollout over the train dataset's ``sample_id`` values.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from ftkit.evidence import EvidenceProfile, EvidenceRun

SAMPLE_ID = "sample_id"


class FtkitCallback(TrainerCallback):
    """See the module docstring. ``run_dir``: the ftkit run directory (default
    ``<args.output_dir>/ftkit``); ``fingerprint_every``: the fingerprint cadence in steps."""

    def __init__(self, run_dir: str | Path | None = None, fingerprint_every: int = 1) -> None:
        self.run_dir = run_dir
        self.fingerprint_every = fingerprint_every
        self.run: EvidenceRun | None = None
        self.witness = False
        self._queue: deque[list[int]] = deque()  # sample ids per collated batch, in order
        self._step_ids: list[int] = []  # ids of the training forwards of the open step
        self._hook: Any = None
        self._nonfinite_since_log = False  # the guard saw a non-finite gradient since the last on_log

    # ------------------------------------------------------------------ witnesses
    def collator(self, base: Callable[[list[dict[str, Any]]], Any] | None = None) -> Callable[..., Any]:
        """A data collator that strips each example's ``sample_id`` and queues them (turns witnesses on)."""
        from transformers import default_data_collator

        inner = base or default_data_collator
        self.witness = True

        def collate(features: list[dict[str, Any]]) -> Any:
            self._queue.append([int(f[SAMPLE_ID]) for f in features])
            return inner([{k: v for k, v in f.items() if k != SAMPLE_ID} for f in features])

        return collate

    def _forward(self, module: Any, args: Any) -> None:
        if module.training and self._queue:
            self._step_ids.extend(self._queue.popleft())

    # ------------------------------------------------------------------ events
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        if self.witness and args.remove_unused_columns:
            raise ValueError("FtkitCallback witnesses need TrainingArguments(remove_unused_columns=False)")
        if self.witness and str(args.eval_strategy) not in ("no", "IntervalStrategy.NO"):
            raise ValueError("FtkitCallback witnesses cannot share the collator with evaluation during training")
        save = args.save_steps if str(args.save_strategy) in ("steps", "SaveStrategy.STEPS") else None
        profile = EvidenceProfile(
            fingerprint_every=self.fingerprint_every,
            witness=self.witness,
            metric_every=args.logging_steps
            if str(args.logging_strategy) in ("steps", "IntervalStrategy.STEPS")
            else None,
            checkpoint_every=int(save) if save else None,
        )
        run_dir = Path(self.run_dir) if self.run_dir is not None else Path(args.output_dir) / "ftkit"
        config = {"trainer": "transformers", "seed": args.seed, "max_steps": state.max_steps}
        self.run = EvidenceRun(run_dir, profile, config=config, producer="ftkit.integrations.transformers")
        if self.witness and model is not None:
            self._hook = model.register_forward_pre_hook(self._forward)

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.run is not None and self.witness:
            loader = kw.get("train_dataloader")
            if loader is not None:
                self.run.allocate(math.floor(state.epoch or 0), [int(ex[SAMPLE_ID]) for ex in loader.dataset])

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        if self.run is None or model is None:
            return
        if not self.run.observe_grads(state.global_step, model, rollout=self._rollout(state)):
            self._nonfinite_since_log = True

    def on_step_end(
        self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None, **kw: Any
    ) -> None:
        if self.run is None:
            return
        step, rollout, run = state.global_step - 1, self._rollout(state), self.run
        run.step_outcome(step, rollout=rollout)
        if run.profile.due("state_fingerprint", step):
            run.fingerprint(step, model, getattr(optimizer, "optimizer", optimizer), rollout=rollout)
        if self.witness:
            run.witness_counts(step, self._step_ids, rollout=rollout)
            self._step_ids = []
        run.log.sync(wait=False)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
        if self.run is not None and logs and "loss" in logs:
            # HF's logging_nan_inf_filter logs a NaN loss as the mean of the earlier ones: the
            # guard's verdict stands instead, never the filtered value.
            loss = math.nan if self._nonfinite_since_log else float(logs["loss"])
            self._nonfinite_since_log = False
            self.run.metric(state.global_step - 1, rollout=self._rollout(state), loss=loss)

    def on_save(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None, **kw: Any) -> None:
        if self.run is not None:
            step = state.global_step - 1
            self.run.publish_checkpoint(
                step, model, getattr(optimizer, "optimizer", optimizer), rollout=self._rollout(state)
            )

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.run is not None:
            self.run.close()
            self.run = None

    def _rollout(self, state: Any) -> int:
        """The witness rollout of the current step: its epoch (a step ending an epoch belongs to it)."""
        return max(0, math.ceil(state.epoch or 0) - 1) if self.witness else 0
