"""``ModuleCapture``: forward-output, output-gradient, input and parameter capture by hooks.

Usage::

    cap = ModuleCapture(model, activations=True, grads=True)
    with cap:                       # hooks live only inside the block
        loss = model(batch); loss.backward()
    cap.write_to(dump_writer, step=4, micro_shard=3)   # or cap.take() for the records

Names are canonical ``<module path>.<kind>``: ``decoder.layers.0.mlp.output`` (a tuple output
gives ``.output.0``, ``.output.1``; ``None`` items are skipped), ``<path>.output_grad[.i]``
for the gradient of that output, ``<path>.input.<i|kwarg>`` with ``inputs=True``, and with
``params=True`` ``<param name>.param`` on entering the block and ``<param name>.grad`` on
leaving it (megatron's ``main_grad`` when present, else ``.grad``). Backward must run inside
the block: leaving it removes every hook, the gradient hooks included. The root module's path
is empty (``output``). A module called a second time in one block gets ``#1`` appended to its
path (``decoder.layers.0#1.output``). Records keep capture order; tensors are detached copies
on CPU with the TP sharding from ``ftkit.tensors.sharding``. Megatron outputs are recorded in
their own layout (often [sequence, batch, hidden]). A GPT model called with ``labels`` returns
the per-token loss, identical on every TP rank: its ``output``/``output_grad`` are replicated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ftkit.tensors.sharding import Sharding, output_sharding, param_sharding, tp_coords

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ftkit.dumps.writer import DumpWriter


@dataclass
class Capture:
    name: str
    tensor: torch.Tensor
    sharding: Sharding


class ModuleCapture:
    def __init__(
        self,
        model: torch.nn.Module,
        activations: bool = True,
        grads: bool = True,
        inputs: bool = False,
        params: bool = False,
        tp_rank: int | None = None,
        tp_size: int | None = None,
    ) -> None:
        self.model = model
        self.activations, self.grads, self.inputs, self.params = activations, grads, inputs, params
        if tp_rank is None or tp_size is None:
            tp_rank, tp_size = tp_coords()
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.records: list[Capture] = []
        self._handles: list[Any] = []
        self._calls: dict[str, int] = {}

    def __enter__(self) -> ModuleCapture:
        if self._handles:
            raise RuntimeError("ModuleCapture is already active")
        self._calls.clear()
        if self.params:
            self._capture_params("param")
        if self.activations or self.grads or self.inputs:
            for path, module in self.model.named_modules():
                self._handles.append(module.register_forward_hook(self._hook(path, module), with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self.params and exc[0] is None:
            self._capture_params("grad")

    def take(self) -> list[Capture]:
        """The records so far, in capture order; clears them."""
        out, self.records = self.records, []
        return out

    def write_to(self, writer: DumpWriter, step: int, micro_shard: int | None = None) -> int:
        """Hand every record to ``writer`` (no second copy) and clear them; returns the count."""
        records = self.take()
        for r in records:
            writer.add(r.name, r.tensor, step=step, micro_shard=micro_shard, sharding=r.sharding, copy=False)
        return len(records)

    def _record(self, name: str, tensor: torch.Tensor, sharding: Sharding) -> None:
        self.records.append(Capture(name, tensor.detach().to("cpu", copy=True), sharding))

    def _hook(self, path: str, module: Any) -> Callable[..., None]:
        def hook(mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            n = self._calls.get(path, 0)
            self._calls[path] = n + 1
            base = path if n == 0 else f"{path}#{n}"
            stem = f"{base}." if base else ""
            if self.inputs:
                items = [(str(i), a) for i, a in enumerate(args)] + list(kwargs.items())
                for key, value in items:
                    if _is_tensor(value):
                        self._record(f"{stem}input.{key}", value, Sharding.replicated(self.tp_rank, self.tp_size))
            loss = _labels_given(args, kwargs)
            for index, suffix, t in _flatten_output(output):
                sharding = output_sharding(module, index, t, self.tp_rank, self.tp_size, path, loss)
                if self.activations:
                    self._record(f"{stem}output{suffix}", t, sharding)
                if self.grads and t.requires_grad:
                    handle = t.register_hook(self._grad_hook(f"{stem}output_grad{suffix}", sharding))  # type: ignore[no-untyped-call]  # torch leaves register_hook unannotated
                    self._handles.append(handle)

        return hook

    def _grad_hook(self, name: str, sharding: Sharding) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            self._record(name, grad, sharding)

        return hook

    def _capture_params(self, kind: str) -> None:
        for name, p in self.model.named_parameters():
            t = p if kind == "param" else getattr(p, "main_grad", None)
            if kind == "grad" and t is None:
                t = p.grad
            if t is not None:
                self._record(f"{name}.{kind}", t, param_sharding(p, self.tp_rank, self.tp_size))


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def _labels_given(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a GPT-style ``forward(input_ids, position_ids, attention_mask, decoder_input,
    labels, ...)`` got labels: megatron then returns the per-token loss, not logits."""
    labels = kwargs.get("labels", args[4] if len(args) > 4 else None)
    return labels is not None


def _flatten_output(output: Any) -> list[tuple[int, str, torch.Tensor]]:
    """``(top-level index, name suffix, tensor)`` for a module output; ``None`` items skipped."""
    if _is_tensor(output):
        return [(0, "", output)]
    if not isinstance(output, (tuple, list)):
        return []
    found = []
    for i, item in enumerate(output):
        if _is_tensor(item):
            found.append((i, f".{i}", item))
        elif isinstance(item, (tuple, list)):
            found.extend((i, f".{i}{suffix}", t) for _, suffix, t in _flatten_output(item))
    return found
