"""A task backed by a prompt dataset (``--prompts FILE``): the ``protocols.RlTask`` of a JSONL
file read through a Hugging Face model's tokenizer.

Built once per process from the config (``prompt_task``): the whole file is read and checked
(``jsonl.JsonlPrompts``: a malformed line is ``ConfigError`` naming ``file:line``),
every prompt rendered (the tokenizer's chat template where it has one) and encoded
(``batching.encode_prompts``: a prompt longer than ``max_prompt_len`` is an error
naming its line; nothing is truncated), then left-padded to exactly ``max_prompt_len`` tokens.
So every prompt row is ``[max_prompt_len]`` and every sequence ``[max_prompt_len +
response_len]``: the shapes come from the config, never from the data of a batch, and the
exactness of the cells (1 cell == 2 cells bitwise) holds as it does for the addition task.

* ``prompts(seed, rollout, count)``: the records ``sampling.rollout_indices``
  draws (epochs of seeded permutations: every prompt once per epoch, the same on resume).
* ``heldout_prompts(seed, count)``: the file's first ``count`` records (repeated in order
  when the file is shorter), the evaluation and canary set: held out as a sample, not as
  content, like the addition task's.
* ``eval_set(seed)``: what ``eval_reward`` scores. With ``--eval-prompts`` (``eval_path``) that
  file's records, read and checked like the training file (same keys, same ``max_prompt_len``),
  all of them once in file order, scored through a task of those records alone (their labels);
  their rows follow the training rows in the table, so ``prompt_pads`` knows them, and
  ``prompts`` never draws them. ``eval_overlap`` counts eval prompts whose tokens (chat template
  applied) are also a training prompt's: ``ftkit train`` warns about them. Without the file:
  ``heldout_prompts(seed)`` and this task.
* Engines sample from the whole vocabulary of the model (``response_tokens``) and stop at the
  tokenizer's ``eos`` (``stop_token``; None with ``ignore_eos``) or after the token that
  completes a ``--stop`` string (``ftkit.tasks.stops``: ``response_ends``): the tokens after the
  end are the pad token, masked out of the loss (``response_mask``: 1 through the end).
* ``reward_sample`` gives a reward the prompt as the model saw it (template applied), the
  response decoded through its end (special tokens skipped, cut before a stop string), the
  record's label and the token ids of both (the response's without ``eos`` and padding).
* ``correct_responses``: the label's tokens then ``eos`` (truncated to ``response_len``),
  what ``check_reward`` scores before a run starts and the canaries score after each sync.

Padding is invisible to the model: ``prompt_pads`` gives each row's left padding, and the
trainer and the megatron engine pass the mask of ``ftkit.train.rl.masks`` (causal, and no real
token attends to a pad) to every forward; the vLLM engine is given the prompts without their
pads. Positions stay ``0..S-1``: with rotary embeddings an attention score depends on the
distance between two tokens only, so a prompt's output does not depend on how much padding
precedes it (up to float rounding). The mask is a function of the data only, so it changes no
exactness argument.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftkit.tasks.stops import Stops

if TYPE_CHECKING:
    from torch import Tensor

    from ftkit.tasks.batching import Encoded
    from ftkit.tasks.protocols import RewardSample

#: Prompts in the held-out evaluation set (``heldout_prompts``), as for the addition task.
HELDOUT_PROMPTS = 32


def prompt_task(
    path: Path,
    model_dir: Path,
    vocab_size: int,
    *,
    input_key: str,
    label_key: str | None,
    max_prompt_len: int,
    response_len: int,
    eval_path: Path | None = None,
    stop: tuple[str, ...] = (),
    ignore_eos: bool = False,
) -> PromptTask:
    """The ``PromptTask`` of the JSONL file ``path`` through the tokenizer of ``model_dir``
    (a model of ``vocab_size`` tokens), with the eval set ``eval_path`` (``--eval-prompts``) read
    and checked the same way; ``ConfigError`` (exit 2) for a malformed line, an empty file, a
    prompt over ``max_prompt_len`` tokens, a tokenizer without ``eos_token`` or a token id outside
    the model's vocabulary. ``stop`` / ``ignore_eos``: what ends a response (``ftkit.tasks.stops``)."""
    from ftkit.errors import ConfigError
    from ftkit.tasks.tokenizer import load_tokenizer

    tok = load_tokenizer(model_dir)
    if tok.eos_token_id is None:
        raise ConfigError(
            f"the tokenizer of {model_dir} has no eos_token (a response of --prompts stops at it)",
            hint="set eos_token in tokenizer_config.json",
        )

    def read(file: Path) -> list[Encoded]:
        from ftkit.tasks.batching import encode_prompts
        from ftkit.tasks.jsonl import JsonlPrompts

        encoded = encode_prompts(tok, JsonlPrompts(file, input_key, label_key), max_prompt_len)
        if not encoded:
            raise ConfigError(f"prompt file {file} holds no prompts", hint="one JSON object per line")
        top = max(max(e.ids) for e in encoded)
        if top >= vocab_size:
            raise ConfigError(
                f"the tokenizer of {model_dir} gives token id {top} (in {file}), outside the model's "
                f"vocabulary of {vocab_size}",
                hint="use the tokenizer the model was trained with",
            )
        return encoded

    held = read(eval_path) if eval_path is not None else []
    task = PromptTask(read(path), tok, vocab_size, max_prompt_len, response_len, held)
    return task.ending(stop, ignore_eos) if stop or ignore_eos else task


class PromptTask:
    """The ``protocols.RlTask`` of encoded prompt records (see the module docstring)."""

    name = "prompts"

    def __init__(
        self,
        encoded: list[Encoded],
        tokenizer: Any,
        vocab_size: int,
        prompt_len: int,
        response_len: int,
        held: list[Encoded] | None = None,
    ):
        import torch

        from ftkit.tasks.batching import pad_prompts

        self.trained, held = len(encoded), held or []
        # rows [0, trained) are the training prompts, the rest the eval set's (--eval-prompts)
        self.encoded, self.tokenizer = [*encoded, *held], tokenizer
        encoded = self.encoded
        self.vocab_size, self.prompt_len, self.response_len = vocab_size, prompt_len, response_len
        self.response_tokens = tuple(range(vocab_size))
        self.eos = int(tokenizer.eos_token_id)
        self.stop_token: int | None = self.eos
        self.stops = Stops(tokenizer, self.eos)
        pad = tokenizer.pad_token_id
        self.pad_token = self.eos if pad is None else int(pad)
        self._table = torch.from_numpy(pad_prompts([e.ids for e in encoded], prompt_len, self.pad_token).ids)
        self._row: dict[tuple[int, ...], int] = {}
        for i in reversed(range(len(encoded))):  # the first record of a repeated prompt wins
            self._row[tuple(int(t) for t in self._table[i])] = i
        answers = torch.full((len(encoded), response_len), self.pad_token, dtype=torch.int64)
        for i, e in enumerate(encoded):
            label = [] if e.record.label is None else list(tokenizer.encode(e.record.label, add_special_tokens=False))
            ids = [*label, self.eos][:response_len]
            answers[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
        self._answers = answers
        self._pads = torch.tensor([prompt_len - len(e.ids) for e in encoded], dtype=torch.int64)
        seen = {tuple(e.ids) for e in encoded[: self.trained]}
        #: eval prompts that are also training prompts (the same tokens after the chat template)
        self.eval_overlap = sum(tuple(e.ids) in seen for e in held)
        self._eval = PromptTask(held, tokenizer, vocab_size, prompt_len, response_len) if held else None

    def ending(self, strings: tuple[str, ...], ignore_eos: bool) -> PromptTask:
        """This task, its responses (and its eval set's) ending at the stop ``strings`` and, unless
        ``ignore_eos``, at ``eos`` (``ftkit.tasks.stops``)."""
        self.stop_token = None if ignore_eos else self.eos
        self.stops = Stops(self.tokenizer, self.stop_token, strings)
        if self._eval is not None:
            self._eval.ending(strings, ignore_eos)
        return self

    @property
    def seq_len(self) -> int:
        """Tokens per sample: ``max_prompt_len + response_len``."""
        return self.prompt_len + self.response_len

    def prompts(self, seed: int, rollout: int, count: int) -> Any:
        """``count`` prompts (int64 ``[count, prompt_len]``) of ``rollout``, a function of
        ``(seed, rollout)`` only."""
        from ftkit.tasks.sampling import rollout_indices

        return self._table[rollout_indices(self.trained, count, seed, rollout)]

    def heldout_prompts(self, seed: int, count: int = HELDOUT_PROMPTS) -> Any:
        """The file's first ``count`` prompts, in order, repeated when it is shorter (``seed``
        is unused: the set is the file's head)."""
        return self._table[[i % self.trained for i in range(count)]]

    def eval_set(self, seed: int) -> tuple[PromptTask, Any]:
        """What ``eval_reward`` scores: with ``--eval-prompts`` every record of that file once, in
        order, and the task that scores them (labels of the eval file's records); else
        ``heldout_prompts(seed)``, the training file's head, and this task."""
        if self._eval is None:
            return self, self.heldout_prompts(seed)
        return self._eval, self._table[self.trained :]

    def _records(self, prompts: Tensor) -> list[int]:
        rows = []
        for p in prompts:
            key = tuple(int(t) for t in p)
            if key not in self._row:
                raise ValueError("a prompt row that is not one of the dataset's")
            rows.append(self._row[key])
        return rows

    def prompt_pads(self, prompts: Tensor) -> Any:
        """int64 ``[n]``: the left padding of each prompt row (of the dataset's rows)."""
        return self._pads[self._records(prompts)]

    def correct_responses(self, prompts: Tensor) -> Any:
        """int64 ``[n, response_len]``: each prompt's label tokens, ``eos``, then padding."""
        return self._answers[self._records(prompts)]

    def response_ends(self, responses: Tensor) -> tuple[Any, Any]:
        """int64 ``[n]`` lengths and bool ``[n]`` stopped: each response through its end (``eos``
        or a stop string, ``ftkit.tasks.stops``)."""
        return self.stops.ends(responses)

    def response_mask(self, responses: Tensor) -> Any:
        """float32 ``[n, response_len]``: 1 through each response's end, 0 after it."""
        import torch

        lengths, _ = self.response_ends(responses)
        return (torch.arange(responses.shape[1])[None, :] < lengths[:, None]).to(torch.float32)

    def reward_sample(self, prompt: Tensor, response: Tensor) -> RewardSample:
        """One sample as a reward plug-in sees it (see the module docstring)."""
        from ftkit.tasks.protocols import RewardSample

        e = self.encoded[self._records(prompt[None, :])[0]]
        r = [int(t) for t in response]
        n, _ = self.stops.end(r)
        r = r[: n - 1] if self.stop_token is not None and n and r[n - 1] == self.stop_token else r[:n]
        r = [t for t in r if t >= 0]  # -1: a greedy position with non-finite logits
        return RewardSample(e.text, self.stops.text(r), e.record.label, list(e.ids), r)

    def decode(self, tokens: Tensor) -> str:
        """The tokenizer's decoding of a token sequence (negative ids dropped)."""
        return str(self.tokenizer.decode([int(t) for t in tokens if int(t) >= 0]))
