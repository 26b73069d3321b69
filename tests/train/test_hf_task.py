"""The addition task through a Hugging Face tokenizer, and the HF model a rank builds: its
padded vocabulary rows give ``-inf`` logits (issue 21)."""

from __future__ import annotations

import pytest

from ftkit.errors import ConfigError
from ftkit.tasks.addition import TaskVocab, task_for
from tests.model.hf_models import make_model


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return make_model("llama", tmp_path_factory.mktemp("hf"), eos=True)


def test_prompts_are_the_text_through_the_tokenizer_and_answers_its_digits(llama):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(llama))
    task = task_for(4, llama, 300)
    prompts = task.prompts(seed=1, rollout=0, count=50)
    assert prompts.shape == (50, task.prompt_len) and int(prompts.max()) < 300
    for row, answer in zip(prompts, task.answers(prompts)):
        text = tok.decode(row[1:])  # after the bos token
        a, b = int(text[0]), int(text[4])
        assert text == f"{a} + {b} =" and int(row[0]) == tok.bos_token_id
        assert tok.decode(answer[:2]) == f"{a + b:02d}" and int(answer[2]) == tok.eos_token_id
    right = task.reward(prompts, task.answers(prompts))
    assert bool((right == 1).all())
    assert set(task.response_tokens) == {tok.eos_token_id, *(tok.convert_tokens_to_ids(str(d)) for d in range(10))}


def test_a_tokenizer_without_eos_or_too_small_a_vocabulary_is_a_config_error(tmp_path, llama):
    with pytest.raises(ConfigError, match="eos_token"):
        TaskVocab.from_tokenizer(make_model("llama", tmp_path), 300)
    with pytest.raises(ConfigError, match="outside the model's vocabulary"):
        TaskVocab.from_tokenizer(llama, 20)


def test_the_loss_ignores_the_padded_vocabulary(llama):
    import torch
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    from ftkit.model.gpt import build_gpt, init_local_parallel
    from ftkit.model.spec import resolve_model

    init_local_parallel("cpu")
    model = build_gpt(resolve_model(str(llama)), 0, "cpu").eval()
    tokens, pos = torch.tensor([[0, 20, 266, 221, 24, 283]]), torch.arange(6)[None]
    labels = torch.roll(tokens, -1, dims=1)
    with torch.no_grad():
        logits = model(tokens, pos, None)  # [b, s, padded vocabulary], finite everywhere
        nll = model(tokens, pos, None, labels=labels)
        # (megatron's cross entropy works in place: hand it a copy)
        with_padding = vocab_parallel_cross_entropy(logits.transpose(0, 1).clone(), labels.T.contiguous()).T
    assert logits.shape[-1] == 1024 and bool(logits.isfinite().all())
    expected = torch.nn.functional.cross_entropy(logits[0, :, :300], labels[0], reduction="none")
    assert torch.allclose(nll[0], expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(with_padding[0], expected, rtol=1e-5, atol=1e-6)  # the padding would change it


def test_every_power_of_two_tp_holds_the_same_padded_vocabulary(llama):
    """300 tokens are 1024 rows at TP 1 and 2 alike (the engines' TP=1 rows are the cells'), and a
    TP the padded rows do not split over is exit 2 naming the vocabulary."""
    from ftkit.train.config import load_config
    from ftkit.train.plan.run_plan import build_plan

    for tp in (1, 2):
        assert build_plan(load_config({"model": str(llama), "tp": tp})).model.hf.padded_vocab == 1024
    with pytest.raises(ConfigError, match="does not split over TP=3"):
        build_plan(load_config({"model": str(llama), "tp": 3}))


def test_pipeline_stages_with_tied_embeddings_are_a_config_error(llama):
    from ftkit.train.config import load_config
    from ftkit.train.plan.run_plan import build_plan

    with pytest.raises(ConfigError, match="tied embeddings"):
        build_plan(load_config({"model": str(llama), "pp": 2}))


def test_a_model_changed_since_the_run_is_a_config_error(llama):
    from ftkit.model.source import content_digest
    from ftkit.train.config import load_config
    from ftkit.train.plan.run_plan import build_plan

    cfg = build_plan(load_config({"model": str(llama)})).config
    assert cfg.model.digest == content_digest(llama)
    assert build_plan(load_config(cfg.model_dump())).config.model == cfg.model  # a run.json record plans again
    with pytest.raises(ConfigError, match="has changed"):
        build_plan(load_config({**cfg.model_dump(), "model_digest": "0" * 16}))
