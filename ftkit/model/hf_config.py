"""A Hugging Face ``config.json`` read into the shape ftkit builds (``HFArch``), failing closed.

``read_config(model_dir)`` loads the JSON; a family (``ftkit.model.families``) turns it into an
``HFArch`` with a ``ConfigReader``, which records every key it consumes. ``ConfigReader.finish``
then refuses (``ModelConfigError``, exit 2, naming the field) any key that is neither consumed
nor a known piece of metadata and holds a value that could change the model (anything but
``None``, ``False``, ``0`` or an empty container): an unfamiliar field is never dropped silently.

``HFArch.padded_vocab`` is the padding rule: the vocabulary rounded up to a multiple of
``VOCAB_DIVISOR`` (1,024), whatever the TP size. So every TP size that divides it (every power of
two up to 1,024) holds the same rows, each rank an equal, whole share (at TP <= 8 a multiple of
megatron's ``make_vocab_size_divisible_by`` of 128): the cells, the engines (TP=1), checkpoints
and dumps see one padded vocabulary at every TP. The padding rows are zero and are removed on
export.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftkit.errors import ConfigError, InputError

#: The padded vocabulary is a multiple of this: 128 (megatron's default divisor) times TP=8.
VOCAB_DIVISOR = 1024
DTYPES = ("float32", "bfloat16", "float16")

# PretrainedConfig attributes that describe generation, bookkeeping or the tokenizer, never the
# network's arithmetic (transformers 4.x and 5.x names).
METADATA = frozenset(
    [
        "_name_or_path",
        "_model_name_or_path",
        "unk_token_id",
        "architectures",
        "model_type",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "use_cache",
        "initializer_range",
        "id2label",
        "label2id",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "problem_type",
        "chunk_size_feed_forward",
        "is_encoder_decoder",
        "is_decoder",
        "tokenizer_class",
        "prefix",
        "task_specific_params",
        "finetuning_task",
        "torchscript",
        "tf_legacy_loss",
        "use_bfloat16",
        "add_cross_attention",
        "cross_attention_hidden_size",
        "tie_encoder_decoder",
        "pruned_heads",
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
        "repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "bad_words_ids",
        "num_return_sequences",
        "output_scores",
        "return_dict_in_generate",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
        "max_window_layers",
    ]
)


class ModelConfigError(ConfigError):
    """A Hugging Face config ftkit cannot represent exactly (exit 2, names the field)."""


@dataclass(frozen=True)
class HFArch:
    """The network a Hugging Face config describes, in ftkit's terms (decoder-only, RMSNorm,
    SwiGLU, RoPE, grouped-query attention)."""

    family: str
    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    max_seq_len: int
    tied: bool
    rope_theta: float
    rope_scaling_factor: float | None  # Llama-3 style scaling (megatron's fixed 1 / 4 / 8192)
    norm_eps: float
    qkv_bias: bool
    qk_norm: bool
    dtype: str  # the checkpoint's dtype (export writes it)

    @property
    def padded_vocab(self) -> int:
        """The vocabulary megatron holds, at every TP size (module docstring)."""
        return -(-self.vocab_size // VOCAB_DIVISOR) * VOCAB_DIVISOR

    def check_layout(self, tp: int, pp: int) -> None:
        """``ModelConfigError`` unless the shapes split over ``tp`` x ``pp`` ranks."""
        for what, n in (
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("intermediate_size", self.ffn_hidden_size),
        ):
            if n % tp:
                raise ModelConfigError(f"{what}={n} does not split over TP={tp}", "choose a TP size that divides it")
        if self.padded_vocab % tp:
            raise ModelConfigError(
                f"vocab_size={self.vocab_size} (padded to {self.padded_vocab} rows) does not split over TP={tp}",
                "choose a power-of-two TP size",
            )
        if self.num_layers < pp:
            raise ModelConfigError(f"num_hidden_layers={self.num_layers} < PP={pp}", "choose a smaller PP size")


def read_config(model_dir: Path) -> dict[str, Any]:
    """The ``config.json`` of ``model_dir`` (``InputError`` when missing or not a JSON object)."""
    path = Path(model_dir) / "config.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(
            f"{path} does not exist", "give a Hugging Face model directory (config.json + *.safetensors)"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}", "the model directory's config.json must be JSON") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path} is not a JSON object", "the model directory's config.json must be a JSON object")
    return doc


def _inert(value: Any) -> bool:
    return value is None or value is False or (isinstance(value, (int, float)) and value == 0) or value in ({}, [], "")


class ConfigReader:
    """Typed access to a config dict that remembers which keys were consumed."""

    def __init__(self, config: dict[str, Any], family: str) -> None:
        self.config, self.family = config, family
        self.used: set[str] = set()

    def bad(self, key: str, why: str) -> ModelConfigError:
        return ModelConfigError(
            f"config.json field {key!r} = {self.config.get(key)!r}: {why}",
            f"ftkit's {self.family} mapping cannot represent it exactly; see docs/models.md (families)",
        )

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        """``config[key]`` of type ``kind``; missing: ``default`` (or an error when none)."""
        self.used.add(key)
        if key not in self.config or (self.config[key] is None and default is not ...):
            if default is ...:
                raise ModelConfigError(f"config.json has no {key!r}", "a Hugging Face config of this family has it")
            return default
        value = self.config[key]
        if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
            raise self.bad(key, f"expected {kind}")
        return value

    def require(self, key: str, allowed: tuple[Any, ...], default: Any = None) -> Any:
        """``config[key]`` (``default`` when absent), which must be one of ``allowed``."""
        self.used.add(key)
        value = self.config.get(key, default)
        if value not in allowed:
            raise self.bad(key, f"only {', '.join(map(repr, allowed))} is supported")
        return value

    def dtype(self) -> str:
        """The checkpoint dtype (``dtype`` in transformers 5, ``torch_dtype`` before); float32 if unset."""
        value = self.config.get("dtype") or self.config.get("torch_dtype") or "float32"
        if value not in DTYPES:
            raise self.bad("dtype" if "dtype" in self.config else "torch_dtype", f"expected one of {DTYPES}")
        return str(value)

    def rope(self) -> tuple[float, float | None]:
        """``(rope_theta, Llama-3 scaling factor or None)`` from ``rope_parameters`` (transformers 5)
        or ``rope_theta`` + ``rope_scaling`` (4.x). Megatron's Llama-3 scaling has
        low_freq_factor 1, high_freq_factor 4 and original_max_position_embeddings 8192 fixed."""
        params = dict(self.get("rope_parameters", dict, {}) or {})
        legacy = self.get("rope_scaling", dict, {}) or {}
        params = {**legacy, **params}
        theta = params.pop("rope_theta", None)
        if theta is None:
            theta = self.get("rope_theta", (int, float), 10000.0)
        self.used.add("rope_theta")
        kind = params.pop("rope_type", params.pop("type", "default"))
        key = "rope_parameters" if "rope_parameters" in self.config else "rope_scaling"
        if kind == "default" and not params:
            return float(theta), None
        fixed = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
        factor = params.pop("factor", None)
        if kind != "llama3" or not isinstance(factor, (int, float)):
            raise self.bad(key, "only default RoPE and Llama-3 scaling (rope_type 'llama3') are supported")
        for name, want in fixed.items():
            if params.pop(name, want) != want:
                raise self.bad(key, f"megatron-core's Llama-3 RoPE scaling has {name}={want} fixed")
        if params:
            raise self.bad(key, f"unsupported RoPE parameter(s) {sorted(params)}")
        return float(theta), float(factor)

    def finish(self) -> None:
        """Refuse any key neither consumed nor metadata that could change the model."""
        for key, value in self.config.items():
            if key not in self.used and key not in METADATA and not _inert(value):
                raise self.bad(key, "not a field ftkit maps")
