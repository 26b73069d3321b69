"""The addition task through a Hugging Face tokenizer, and the HF model a rank builds: its
padded vocabulary rows give ``-inf`` logits (issue 21)."""

from __future__ import annotations

import pytest

from ftkit.errors import ConfigError
from ftkit.train.rl.task import TaskVocab, task_for
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


def test_the_padded_vocabulary_gives_minus_inf_logits(llama):
    import torch

    from ftkit.model.gpt import GPTSpec, build_gpt, init_local_parallel

    init_local_parallel("cpu")
    model = build_gpt(GPTSpec(str(llama), 0, hf_dir=str(llama)), "cpu").eval()
    tokens = torch.tensor([[0, 20, 266, 221, 24, 283]])
    with torch.no_grad():
        logits = model(tokens, torch.arange(6)[None], None)
    assert logits.shape[-1] == 384
    assert bool(torch.isneginf(logits[..., 300:]).all()) and bool(logits[..., :300].isfinite().all())
