"""A tiny random-init Llama trained by the Hugging Face ``Trainer`` with ``FtkitCallback`` on CPU
(run directly for one process, or under torchrun for DDP). ``--plant-divergence STEP`` perturbs
rank 1's weights once after that optimizer step (before ftkit fingerprints it); ``--plant-nan STEP``
makes the loss of that step's first micro-batch NaN on rank 0 (so its gradients, through backward,
clipping and the DDP all-reduce, are NaN at the optimizer step)."""

from __future__ import annotations

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

from ftkit.integrations.transformers import FtkitCallback


class Perturb(TrainerCallback):  # type: ignore[misc]
    def __init__(self, step: int | None) -> None:
        self.step = step

    def on_step_end(self, args, state, control, model=None, **kw):
        if state.global_step - 1 == self.step and args.process_index == 1:
            with torch.no_grad():
                next(model.parameters()).add_(1e-3)


class PlantNan(TrainerCallback):  # type: ignore[misc]
    def __init__(self, step: int | None) -> None:
        self.step, self.armed = step, False

    def on_train_begin(self, args, state, control, model=None, **kw):
        model.register_forward_hook(self._poison)

    def on_step_begin(self, args, state, control, **kw):
        self.armed = state.global_step == self.step and args.process_index == 0

    def _poison(self, module, inputs, output):
        if self.armed and module.training:
            self.armed = False
            output["loss"] = output["loss"] * float("nan")
        return output


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--plant-divergence", type=int)
    p.add_argument("--plant-nan", type=int)
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=16,
    )  # fmt: skip
    model = LlamaForCausalLM(cfg)
    data = torch.randint(0, 64, (16, 8), generator=torch.Generator().manual_seed(1))
    ds = [{"input_ids": row, "labels": row, "sample_id": i} for i, row in enumerate(data)]
    ftkit_cb = FtkitCallback(a.out)
    args = TrainingArguments(
        output_dir=f"{a.out}/hf", per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=4,
        num_train_epochs=1, logging_steps=1, save_steps=2, save_strategy="steps", report_to=[], use_cpu=True,
        remove_unused_columns=False, seed=0, data_seed=0, disable_tqdm=True, learning_rate=1e-2,
    )  # fmt: skip
    callbacks = [Perturb(a.plant_divergence), PlantNan(a.plant_nan), ftkit_cb]
    Trainer(model=model, args=args, train_dataset=ds, data_collator=ftkit_cb.collator(), callbacks=callbacks).train()
    if torch.distributed.is_initialized():  # under torchrun: Trainer made the group; gloo's threads end before exit
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
