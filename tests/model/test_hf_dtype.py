"""The dtype of an imported Hugging Face checkpoint (issue 37, docs/models.md "Import"): a bf16
checkpoint made by transformers is built and read as stored in a bf16 run (the model's bf16
weights are the file's bits, no float32 copy of the model, the float32 masters their exact
upcast) and upcast exactly in an fp32 run; both bf16 builds compute the same bits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ftkit.model.families import load_arch
from ftkit.model.gpt import build_gpt, configure_determinism, init_local_parallel
from ftkit.model.hf_export import hf_tensors
from ftkit.model.hf_import import stored_dtype
from ftkit.model.spec import resolve_model
from ftkit.train.rank.precision import split_masters
from tests.model.hf_models import make_model


@pytest.fixture(scope="module", autouse=True)
def world() -> None:
    configure_determinism(1)
    init_local_parallel("cpu")


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("llama", tmp_path_factory.mktemp("bf16"), dtype="bfloat16", tie_word_embeddings=False)


def _as_hf(model_dir: Path, named: list[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The Hugging Face tensors of a TP = PP = 1 model's ``(name, parameter)`` pairs."""
    return hf_tensors([{n: p.detach() for n, p in named}], load_arch(model_dir))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def test_a_bf16_checkpoint_is_built_in_bf16_and_holds_the_files_bits(bf16_model: Path) -> None:
    source = load_file(str(bf16_model / "model.safetensors"))
    assert {t.dtype for t in source.values()} == {torch.bfloat16}
    assert stored_dtype(bf16_model, load_arch(bf16_model)) == "bfloat16"
    model = build_gpt(resolve_model(str(bf16_model), ""), 0, "cpu", "bfloat16")
    built = list(model.named_parameters())
    assert {p.dtype for _, p in built} == {torch.bfloat16}  # no float32 copy of the model was made
    storage = {n: p.data_ptr() for n, p in built}
    weights, masters = split_masters(model, "bf16")
    assert {n: p.data_ptr() for n, p in weights} == storage  # the bf16 weights are the ones read
    exported = _as_hf(bf16_model, weights)
    assert set(exported) == set(source)
    for name, tensor in source.items():
        assert exported[name].dtype == torch.bfloat16 and torch.equal(_bits(exported[name]), _bits(tensor)), name
    for (_, w), (_, m) in zip(weights, masters):
        assert m.dtype == torch.float32 and torch.equal(m, w.float()) and torch.equal(m.to(torch.bfloat16), w)


def test_an_fp32_run_upcasts_a_bf16_checkpoint_exactly(bf16_model: Path) -> None:
    source = load_file(str(bf16_model / "model.safetensors"))
    model = build_gpt(resolve_model(str(bf16_model), ""), 0, "cpu", "float32")
    weights, masters = split_masters(model, "fp32")
    assert weights is masters and {p.dtype for _, p in weights} == {torch.float32}
    exported = _as_hf(bf16_model, weights)
    for name, tensor in source.items():
        assert torch.equal(exported[name], tensor.float()), name


def test_both_bf16_builds_hold_and_compute_the_same_bits(bf16_model: Path) -> None:
    """A bf16 checkpoint read as stored vs built in float32 and cast (the build before issue 37):
    the same weights and masters, and the same logits (the build dtype changes nothing else)."""
    spec = resolve_model(str(bf16_model), "")
    direct = build_gpt(spec, 0, "cpu", "bfloat16")
    upcast = build_gpt(spec, 0, "cpu", "float32")
    built = {n: p.data_ptr() for n, p in upcast.named_parameters()}
    (wa, ma), (wb, mb) = split_masters(direct, "bf16"), split_masters(upcast, "bf16")
    assert all(m.data_ptr() == built[n] for n, m in mb)  # a float32 build's masters take its storage
    for (n, a), (_, b), (_, c), (_, d) in zip(wa, wb, ma, mb):
        assert torch.equal(_bits(a), _bits(b)) and torch.equal(c, d), n
    tokens = torch.randint(0, 300, (2, 9), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(9).unsqueeze(0).expand(2, -1)
    with torch.no_grad():
        assert torch.equal(_bits(direct(tokens, pos, None)), _bits(upcast(tokens, pos, None)))


def test_other_checkpoints_are_built_in_float32(bf16_model: Path, tmp_path: Path) -> None:
    fp32 = make_model("llama", tmp_path)
    assert stored_dtype(fp32, load_arch(fp32)) == "float32"
    model = build_gpt(resolve_model(str(fp32), ""), 0, "cpu", "bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # the masters keep every fp32 bit
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for f in bf16_model.iterdir():
        (mixed / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(mixed / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"].float()
    save_file(tensors, str(mixed / "model.safetensors"), metadata={"format": "pt"})
    assert stored_dtype(mixed, load_arch(mixed)) is None
    model = build_gpt(resolve_model(str(mixed), ""), 0, "cpu", "bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
