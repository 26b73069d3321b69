"""ModuleCapture on plain torch modules: canonical names, capture order, values, hook removal."""

from __future__ import annotations

import json

import torch

from ftkit.dumps.capture import ModuleCapture
from ftkit.dumps.writer import DumpWriter


class Pair(torch.nn.Module):
    """Returns a tuple with a None, like megatron's (output, bias) pairs."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, scale=None):
        y = self.lin(x)
        return (y, None, y * 2) if scale is None else (y * scale, None, y)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pair = Pair()
        self.act = torch.nn.Tanh()
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x):
        y, _, z = self.pair(x)
        h = self.act(y) + self.act(z)  # the same module called twice
        return self.head(h)


def _run(net, **kw):
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    cap = ModuleCapture(net, tp_rank=0, tp_size=1, **kw)
    with cap:
        out = net(x)
        out.sum().backward()
    return cap, x, out


def test_names_and_capture_order():
    torch.manual_seed(0)
    net = Net()
    cap, _, _ = _run(net)
    names = [r.name for r in cap.records]
    forward = [
        "pair.lin.output",
        "pair.output.0",
        "pair.output.2",
        "act.output",
        "act#1.output",
        "head.output",
        "output",
    ]
    assert names[:7] == forward  # post-order: children complete before their parents
    backward = names[7:]
    assert set(backward) == {n.replace("output", "output_grad", 1) for n in forward}
    # The root returns head's output tensor itself: both hooks fire first, in registration order.
    assert backward[:2] == ["head.output_grad", "output_grad"]
    assert backward.index("act#1.output_grad") < backward.index("pair.output_grad.2")
    assert backward.index("pair.lin.output_grad") < backward.index("pair.output_grad.0")  # one tensor


def test_values_are_detached_cpu_copies_of_the_real_tensors():
    torch.manual_seed(0)
    net = Net()
    cap, x, out = _run(net)
    rec = {r.name: r.tensor for r in cap.records}
    with torch.no_grad():
        y = net.pair.lin(x)
    assert torch.equal(rec["pair.lin.output"], y)
    assert torch.equal(rec["act.output"], torch.tanh(y)) and torch.equal(rec["act#1.output"], torch.tanh(2 * y))
    assert torch.equal(rec["output"], out.detach())
    assert torch.equal(rec["output_grad"], torch.ones_like(out))
    assert all(not t.requires_grad and t.device.type == "cpu" for t in rec.values())
    assert all(r.sharding.kind == "replicated" for r in cap.records)


def test_params_inputs_and_switches():
    torch.manual_seed(0)
    net = Net()
    cap, x, _ = _run(net, activations=False, grads=False, inputs=True, params=True)
    rec = {r.name: r.tensor for r in cap.records}
    names = [r.name for r in cap.records]
    params = [n for n, _ in net.named_parameters()]
    assert names[: len(params)] == [f"{n}.param" for n in params]  # on entering the block
    assert names[-len(params) :] == [f"{n}.grad" for n in params]  # on leaving it
    assert torch.equal(rec["head.weight.grad"], net.head.weight.grad)
    assert torch.equal(rec["pair.input.0"], x) and torch.equal(rec["input.0"], x)
    assert not any(n.endswith(".output") or "output_grad" in n for n in names)


def test_hooks_are_removed_on_exit_and_records_taken():
    torch.manual_seed(0)
    net = Net()
    cap, _, _ = _run(net)
    assert cap.take() and cap.records == []
    net(torch.randn(2, 4)).sum().backward()  # outside the block: nothing is recorded
    assert cap.records == []
    assert all(not m._forward_hooks for m in net.modules())


def test_write_to_hands_records_to_a_dump_writer(tmp_path):
    torch.manual_seed(0)
    net = Net()
    cap, _, _ = _run(net)
    expected = [r.name for r in cap.records]
    dw = DumpWriter(tmp_path, "actor", "fwd_bwd", 0, "step000002-ms001-tp0-pp0")
    assert cap.write_to(dw, step=2, micro_shard=1) == len(expected)
    assert cap.records == []
    dw.write()
    idx = json.loads(dw.index_path.read_text())
    assert [t["name"] for t in idx["tensors"]] == expected
    assert {(t["step"], t["micro_shard"]) for t in idx["tensors"]} == {(2, 1)}
    assert {t["kind"] for t in idx["tensors"]} == {"output", "output_grad"}
