"""Sampling controls (issue 40 item 1): ``--temperature``, ``--top-p``, ``--top-k``, ``--stop``,
``--ignore-eos``. Where a response ends (``ftkit.tasks.stops``) with a real tokenizer; the engine
actor cuts a response after a stop string; bad settings are exit 2 before Ray; (slow) real runs:
a prompt dataset sampled at temperature 0.8 with top-k, top-p and a stop string trains the same
bits on one and two cells with the engine's log-probs bitwise the trainer's (FT114), every
recorded response ends where its text first holds the stop string; greedy training
(``--temperature 0``) runs and says why it learns nothing; a resume keeps the sampling settings.
The megatron engine's log-probs under each setting: tests/train/test_engine_scoring.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.model.hf_models import make_model
from tests.train.test_prompt_task import config, ftkit, write_prompts

SHAPE = ("--max-prompt-len", "12", "--max-response-len", "10")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return make_model("llama", tmp_path_factory.mktemp("hf"), eos=True)


def _response(task, text: str) -> torch.Tensor:
    """``text``'s tokens as one response row (padded to ``response_len``)."""
    ids = task.tokenizer.encode(text, add_special_tokens=False)[: task.response_len]
    row = torch.full((1, task.response_len), task.pad_token, dtype=torch.int64)
    row[0, : len(ids)] = torch.tensor(ids)
    return row


def test_a_stop_string_ends_a_response_after_the_token_that_completes_it(llama, tmp_path):
    task = config(llama, write_prompts(tmp_path / "p.jsonl"), response_len=10, stop=("\n",)).task.build()
    row = _response(task, "15\nthe rest")
    ids, tok = row[0].tolist(), task.tokenizer
    n = next(k for k in range(1, len(ids) + 1) if "\n" in tok.decode(ids[:k]))  # the first prefix that holds it
    lengths, stopped = task.response_ends(row)
    assert lengths.tolist() == [n] and stopped.tolist() == [True]
    assert task.response_mask(row)[0].tolist() == [1.0] * n + [0.0] * (10 - n)
    sample = task.reward_sample(task.prompts(0, 0, 1)[0], row[0])
    assert sample.response == "15" and sample.response_ids == ids[:n]  # text before the stop, tokens through it
    eos = task.stop_token
    early = row.clone()
    early[0, 0] = eos  # an eos before the stop string still ends it first
    assert task.response_ends(early)[0].tolist() == [1]
    none = _response(task, "15 and no newline at all")
    assert task.response_ends(none)[1].tolist() == [False]  # cut at the limit: truncated_fraction counts it


def test_ignore_eos_lets_a_response_run_past_eos(llama, tmp_path):
    task = config(llama, write_prompts(tmp_path / "p.jsonl"), ignore_eos=True).task.build()
    assert task.stop_token is None
    row = torch.full((1, task.response_len), 7, dtype=torch.int64)
    row[0, 1] = task.eos
    assert task.response_ends(row)[0].tolist() == [task.response_len]
    assert task.response_mask(row).sum() == task.response_len


def test_the_engine_actor_cuts_a_response_after_a_stop_string(llama, tmp_path):
    from ftkit.engines.megatron import MegatronEngine
    from ftkit.train.rl.engines import GEN_CHUNK, EngineActor
    from tests.train.fake_lm import FakeLM

    plain = config(llama, write_prompts(tmp_path / "p.jsonl")).task.build()
    seven = 7
    stop = plain.tokenizer.decode([seven, seven])
    plan = config(llama, tmp_path / "p.jsonl", stop=(stop,))
    task = plan.task.build()

    def fill(logits):  # token 7 is the only likely token
        logits[:, :, seven] = 50.0

    engine = EngineActor.__new__(EngineActor)  # the generation loop only: no model build, no events
    engine.cfg, engine.task, engine.allowed = plan.config, task, None
    engine.llm = MegatronEngine(
        FakeLM(task.vocab_size, fill), "cpu", pad_token=task.pad_token, chunk=GEN_CHUNK, vocab_size=task.vocab_size
    )
    responses, logprobs = engine.generate(task.prompts(0, 0, 3), rollout=0, first_index=0)
    pad = task.pad_token
    assert responses.tolist() == [[seven, seven] + [pad] * 4] * 3
    assert bool((logprobs[:, 2:] == 0).all()) and bool(logprobs[:, :2].isfinite().all())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--temperature", "0.7"), "temperature 0.7 needs loss='grpo'"),
        (("--stop", "\n"), "stop needs prompts"),
        (("--ignore-eos",), "ignore_eos needs prompts"),
        (("--top-p", "0"), "top_p"),
        (("--top-p", "1.5"), "top_p"),
        (("--top-k", "-1"), "top_k"),
        (("--temperature", "nan", "--loss", "grpo"), "temperature"),
        (("--stop", "", "--loss", "grpo"), "an empty stop string"),
    ],
)
def test_bad_sampling_settings_are_exit_2_before_ray(tmp_path, args, message):
    res = ftkit("train", "--out", str(tmp_path / "run"), *args)
    assert res.returncode == 2 and message in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "run").exists()


def _metric_values(run: Path, name: str) -> list[float]:
    events = [json.loads(line) for f in (run / "events").glob("driver-*.jsonl") for line in f.read_text().splitlines()]
    return [e["values"][name] for e in events if e["type"] == "metric" and name in e["values"]]


@pytest.mark.slow
def test_sampled_with_every_control_a_prompt_run_is_exact_on_one_and_two_cells(llama, tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl")
    sampling = ("--temperature", "0.8", "--top-k", "40", "--top-p", "0.9", "--stop", "a")
    runs = {}
    for cells in (1, 2):
        out = tmp_path / f"cells{cells}"
        res = ftkit(
            "train", "--model", str(llama), "--prompts", str(prompts), "--reward", "exact_match", *SHAPE,
            "--loss", "grpo", "--rollouts", "2", "--steps-per-rollout", "2", "--samples-per-rollout", "8",
            "--micro-shards", "2", "--group-size", "4", "--dump-rollouts", "all", "--seed", "3",
            "--out", str(out), "--cells", str(cells), *sampling,
        )  # fmt: skip
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert "sampling temperature 0.8, top-p 0.9, top-k 40, stop ('a',)" in res.stderr
        diffs = _metric_values(out, "logprob_diff_max_abs")
        assert diffs and set(diffs) == {0.0}  # FT114: the engine's log-probs are the trainer's, bit for bit
        runs[cells] = out
    recorded = json.loads((runs[1] / "run.json").read_text())["config"]
    assert (recorded["temperature"], recorded["top_p"], recorded["top_k"], recorded["stop"]) == (0.8, 0.9, 40, ["a"])
    compare = ftkit("compare-dumps", "--exact", str(runs[1]), str(runs[2]))
    assert compare.returncode == 0, compare.stdout[-3000:] + compare.stderr[-3000:]
    task = config(llama, prompts, response_len=10, stop=("a",)).task.build()
    tok, stopped = task.tokenizer, 0
    for f in sorted((runs[1] / "rollouts").glob("*.safetensors")):
        batch = load_file(f)
        responses, mask = batch["tokens"][:, 12:], batch["loss_mask"][:, 11:-1]
        for row, learned in zip(responses.tolist(), mask):
            n = int(learned.sum())
            assert all(t == task.pad_token for t in row[n:])  # nothing after the end
            texts = [tok.decode(row[:k], skip_special_tokens=True) for k in (n - 1, n)]
            if "a" in texts[1] and row[n - 1] != task.eos:  # ended by the stop string: first there
                assert "a" not in texts[0]
                stopped += 1
    assert stopped > 0  # the stop string did end responses


@pytest.mark.slow
def test_greedy_training_runs_says_why_it_learns_nothing_and_a_resume_keeps_the_settings(tmp_path):
    out = tmp_path / "greedy"
    base = ("--loss", "grpo", "--rollouts", "1", "--samples-per-rollout", "16", "--micro-shards", "2")
    res = ftkit("train", "--out", str(out), "--temperature", "0", *base)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "greedy sampling (--temperature 0) gives every sample of a group the same response" in res.stderr
    assert set(_metric_values(out, "logprob_diff_max_abs")) == {0.0}
    assert set(_metric_values(out, "zero_advantage_groups")) == {1.0}
    resumed = ftkit("train", "--resume", str(out), "--rollouts", "2", "--temperature", "1")
    assert resumed.returncode == 2 and "temperature" in resumed.stderr, resumed.stderr
