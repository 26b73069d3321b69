"""Prompt rendering (chat template where present) and fixed-shape padding."""

import numpy as np
import pytest

from ftkit.errors import ConfigError
from ftkit.tasks.batching import encode_prompts, pad_id_of, pad_prompts, pad_responses, render_prompt
from ftkit.tasks.protocols import PromptRecord, Tokenizer


class CharTokenizer:
    """A protocol tokenizer: one id per character (``ord``), bos 1 as its special token."""

    pad_token_id = None

    def encode(self, text, add_special_tokens=True):
        return ([1] if add_special_tokens else []) + [ord(c) for c in text]


def _hf_tokenizer():
    """A real transformers tokenizer built offline, with a chat template (transformers is a
    dependency with the Hugging Face models; no skip when it is missing)."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "<unk>": 2, "<|user|>": 3, "<|assistant|>": 4, "<|system|>": 5}
    for w in ["what", "is", "2", "+", "3", "?", "be", "brief"]:
        vocab.setdefault(w, len(vocab))
    raw = RawTokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", bos_token="<s>", unk_token="<unk>")
    tok.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    return tok, vocab


REC = PromptRecord("what is 2 + 3 ?", "5", "p.jsonl:1")


def test_without_a_template_the_text_is_encoded_with_special_tokens():
    tok = CharTokenizer()
    assert isinstance(tok, Tokenizer)
    enc = render_prompt(tok, PromptRecord("ab", None, "f:1"))
    assert (enc.text, enc.ids) == ("ab", [1, 97, 98])
    with pytest.raises(ConfigError, match="system prompt needs a tokenizer with a chat template"):
        render_prompt(tok, REC, system="be brief")


def test_a_transformers_chat_template_is_applied_once_without_extra_special_tokens():
    tok, vocab = _hf_tokenizer()
    enc = render_prompt(tok, REC)
    assert enc.text == "<|user|> what is 2 + 3 ? <|assistant|>"
    assert enc.ids == [vocab[w] for w in enc.text.split()]  # no <s> added on top of the template
    with_system = render_prompt(tok, REC, system="be brief")
    assert with_system.text == "<|system|> be brief <|user|> what is 2 + 3 ? <|assistant|>"
    assert pad_id_of(tok) == 0


def test_prompts_are_left_padded_to_the_configured_length_not_the_batch_maximum():
    out = pad_prompts([[7, 8], [9], [4, 5, 6]], max_prompt_len=5, pad_id=0)
    np.testing.assert_array_equal(out.ids, [[0, 0, 0, 7, 8], [0, 0, 0, 0, 9], [0, 0, 4, 5, 6]])
    np.testing.assert_array_equal(out.mask, out.ids != 0)
    np.testing.assert_array_equal(out.lengths, [2, 1, 3])
    assert out.ids.dtype == np.int64 and out.mask.dtype == bool
    # the shape is the config's whatever the batch holds: a micro-shard of short prompts is as wide
    assert pad_prompts([[1]], 5, 0).ids.shape == (1, 5)


def test_responses_are_right_padded():
    out = pad_responses([[3, 2], [5, 6, 2]], max_response_len=4, pad_id=0)
    np.testing.assert_array_equal(out.ids, [[3, 2, 0, 0], [5, 6, 2, 0]])
    np.testing.assert_array_equal(out.mask, [[1, 1, 0, 0], [1, 1, 1, 0]])


def test_a_prompt_longer_than_the_maximum_is_an_error_naming_its_source():
    tok = CharTokenizer()
    records = [PromptRecord("ok", None, "d.jsonl:1"), PromptRecord("far too long", None, "d.jsonl:2")]
    with pytest.raises(ConfigError) as e:
        encode_prompts(tok, records, max_prompt_len=4)
    assert e.value.message == "prompt at d.jsonl:2 has 13 tokens, more than the maximum of 4"
    assert "--max-prompt-len to at least 13" in e.value.hint
    with pytest.raises(ConfigError, match="response 1 has 3 tokens, more than the maximum of 2"):
        pad_responses([[1], [1, 2, 3]], 2, 0)


def test_pad_id_must_come_from_somewhere():
    assert pad_id_of(CharTokenizer(), pad_id=2) == 2
    with pytest.raises(ConfigError, match="no pad token"):
        pad_id_of(CharTokenizer())


def test_the_shipped_dataset_through_a_real_tokenizer_has_the_configured_shape_or_a_named_error():
    from itertools import islice

    from ftkit.tasks.datasets import arithmetic_path
    from ftkit.tasks.jsonl import JsonlPrompts

    tok, _ = _hf_tokenizer()
    records = list(islice(JsonlPrompts(arithmetic_path(), "prompt", "answer"), 32))
    encoded = encode_prompts(tok, records, max_prompt_len=64)
    padded = pad_prompts([e.ids for e in encoded], 64, pad_id_of(tok))
    assert padded.ids.shape == (32, 64) and len(set(padded.lengths.tolist())) > 1  # variable lengths, one shape
    assert all(e.text.startswith("<|user|> ") and e.text.endswith(" <|assistant|>") for e in encoded)
    shortest = int(padded.lengths.min())
    with pytest.raises(ConfigError, match=r"prompt at .*arithmetic\.jsonl:\d+ has \d+ tokens"):
        encode_prompts(tok, records, max_prompt_len=shortest)
