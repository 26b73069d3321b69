"""``ftkit train --prompts`` (issue 22 item 1): the dataset-backed task on a small random-init
Hugging Face Llama and its tokenizer, its config errors through the CLI (exit 2 before Ray),
the engines' eos stopping, and (slow) 1 cell == 2 cells bitwise on a prompt file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.model.hf_models import make_model

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = [(3, 4), (12, 5), (1, 1), (7, 2), (20, 13)]
SHAPE = ("--max-prompt-len", "12", "--max-response-len", "6")


def ftkit(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "ftkit", *args], capture_output=True, text=True, timeout=900, env=env)


def write_prompts(path: Path, lines: list[str] | None = None) -> Path:
    rows = [json.dumps({"prompt": f"{a} + {b} =", "answer": a + b}) for a, b in PROBLEMS]
    path.write_text("\n".join(rows if lines is None else lines) + "\n")
    return path


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return make_model("llama", tmp_path_factory.mktemp("hf"), eos=True)


def config(llama: Path, prompts: Path, **kw):
    from ftkit.train.config import load_config
    from ftkit.train.plan.run_plan import build_plan

    values = dict(model=str(llama), prompts=str(prompts), reward="exact_match", max_prompt_len=12, response_len=6)
    values.update(samples_per_rollout=8, micro_shards=2, group_size=4, **kw)
    return build_plan(load_config(values))


def test_prompts_are_left_padded_to_the_configured_width_and_responses_stop_at_eos(llama, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(llama))
    task = config(llama, write_prompts(tmp_path / "p.jsonl")).task.build()
    assert (task.prompt_len, task.response_len, task.seq_len) == (12, 6, 18)
    prompts = task.prompts(seed=1, rollout=0, count=5)
    assert prompts.shape == (5, 12)  # the width of the config, not of the longest prompt
    seen = set()
    for row in prompts:
        ids = tok.encode(tok.decode(row[row != task.pad_token]), add_special_tokens=True)
        assert row[-len(ids) :].tolist() == ids and bool((row[: -len(ids)] == task.pad_token).all())
        seen.add(task.reward_sample(row, torch.tensor([task.stop_token] * 6)).prompt)
    assert seen == {f"{a} + {b} =" for a, b in PROBLEMS}  # one epoch: every prompt once
    right = task.correct_responses(prompts)
    eos = task.stop_token
    for row, answer in zip(prompts, right):
        sample = task.reward_sample(row, answer)
        a, b = (int(x) for x in sample.prompt.rstrip(" =").split(" + "))
        assert sample.response == sample.label == str(a + b)
        assert sample.response_ids == tok.encode(str(a + b), add_special_tokens=False)
    stops = torch.tensor([[5, eos, 7, 7, 7, 7], [5, 6, 7, 8, 9, 10], [eos, 1, 1, 1, 1, 1]])
    assert task.response_mask(stops).tolist() == [[1, 1, 0, 0, 0, 0], [1] * 6, [1, 0, 0, 0, 0, 0]]


def test_a_chat_template_is_applied_where_the_tokenizer_has_one(llama, tmp_path):
    import shutil

    model = tmp_path / "chat"
    shutil.copytree(llama, model)
    cfg_path = model / "tokenizer_config.json"
    tok_cfg = json.loads(cfg_path.read_text())
    tok_cfg["chat_template"] = "{% for m in messages %}Q: {{ m['content'] }}\n{% endfor %}A:"
    cfg_path.write_text(json.dumps(tok_cfg))
    task = config(model, write_prompts(tmp_path / "p.jsonl"), max_prompt_len=24).task.build()
    texts = {task.reward_sample(p, task.correct_responses(p[None])[0]).prompt for p in task.heldout_prompts(0, 5)}
    assert texts == {f"Q: {a} + {b} =\nA:" for a, b in PROBLEMS}


def test_an_engine_stops_a_response_at_eos_and_pads_the_rest(llama, tmp_path):
    from ftkit.engines.megatron import MegatronEngine
    from ftkit.train.rl.engines import GEN_CHUNK, EngineActor
    from tests.train.fake_lm import FakeLM

    task = config(llama, write_prompts(tmp_path / "p.jsonl")).task.build()
    eos, seven = task.stop_token, 7

    def fill(logits):  # eos is the only likely token after the second response position
        logits[:, :, seven] = 50.0
        logits[task.prompt_len + 1 :, :, eos] = 100.0

    engine = EngineActor.__new__(EngineActor)  # the generation loop only: no model build, no events
    engine.cfg, engine.task, engine.allowed = config(llama, tmp_path / "p.jsonl").config, task, None
    engine.llm = MegatronEngine(
        FakeLM(task.vocab_size, fill), "cpu", pad_token=task.pad_token, chunk=GEN_CHUNK, vocab_size=task.vocab_size
    )
    responses, logprobs = engine.generate(task.prompts(0, 0, GEN_CHUNK + 2), rollout=0, first_index=0)
    pad = task.pad_token
    assert responses.tolist() == [[seven, seven, eos, pad, pad, pad]] * (GEN_CHUNK + 2)
    assert bool((logprobs[:, 3:] == 0).all()) and bool(logprobs[:, :3].isfinite().all())


def test_prompt_config_errors_are_exit_2_before_ray(llama, tmp_path):
    good = write_prompts(tmp_path / "good.jsonl")
    base = ("train", "--out", str(tmp_path / "run"), "--reward", "exact_match", *SHAPE)
    res = ftkit(*base, "--prompts", str(good))  # the default model is the tiny preset
    assert res.returncode == 2 and "prompts need a model with a tokenizer" in res.stderr, res.stderr
    assert "--model PATH" in res.stderr
    bad = write_prompts(tmp_path / "bad.jsonl", [json.dumps({"prompt": "1 + 1 =", "answer": 2}), '{"prompt": "2 +'])
    res = ftkit(*base, "--model", str(llama), "--prompts", str(bad))
    assert res.returncode == 2 and f"{bad}:2 is not valid JSON" in res.stderr, res.stderr
    long = write_prompts(tmp_path / "long.jsonl", [json.dumps({"prompt": "1 + 1 =", "answer": 2})] * 2 + [
        json.dumps({"prompt": "The capital of France is Paris. " * 4, "answer": 0})
    ])  # fmt: skip
    res = ftkit(*base, "--model", str(llama), "--prompts", str(long))
    assert res.returncode == 2 and f"prompt at {long}:3 has" in res.stderr, res.stderr
    assert "more than the maximum of 12" in res.stderr and "--max-prompt-len" in res.stderr
    res = ftkit(*base[:-4], "--model", str(llama), "--max-prompt-len", "12")  # no --prompts: not ignored
    assert res.returncode == 2 and "apply to prompts only" in res.stderr, res.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_prompt_dataset_trains_the_same_bits_on_one_and_two_cells(llama, tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl")
    runs = {}
    for cells in (1, 2):
        out = tmp_path / f"cells{cells}"
        res = ftkit(
            "train", "--model", str(llama), "--prompts", str(prompts), "--reward", "exact_match", *SHAPE,
            "--loss", "grpo", "--rollouts", "1", "--steps-per-rollout", "2", "--samples-per-rollout", "8",
            "--micro-shards", "2", "--group-size", "4", "--dump-rollouts", "all", "--seed", "3",
            "--out", str(out), "--cells", str(cells),
        )  # fmt: skip
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        analyzed = ftkit("analyze-events", str(out / "events"))
        assert analyzed.returncode == 0, analyzed.stdout[-3000:]
        runs[cells] = out
    recorded = json.loads((runs[1] / "run.json").read_text())
    assert recorded["task"]["name"] == "prompts" and recorded["task"]["prompt_len"] == 12
    compare = ftkit("compare-dumps", "--exact", str(runs[1]), str(runs[2]))
    assert compare.returncode == 0, compare.stdout[-3000:] + compare.stderr[-3000:]


def test_the_prompt_file_is_recorded_by_path_and_digest_and_must_not_change(llama, tmp_path):
    from ftkit.errors import ConfigError

    prompts = write_prompts(tmp_path / "p.jsonl")
    recorded = config(llama, prompts).config.model_dump(mode="json")  # the flat record of run.json
    assert recorded["prompts"] == str(prompts.absolute()) and len(recorded["prompts_digest"]) == 16
    assert config(llama, prompts, prompts_digest=recorded["prompts_digest"]).config.task.prompts_digest
    write_prompts(prompts, [json.dumps({"prompt": "1 + 1 =", "answer": 2})])
    with pytest.raises(ConfigError, match="the prompt file .* has changed"):  # exit 2
        config(llama, prompts, prompts_digest=recorded["prompts_digest"])


def test_the_mask_hides_each_rows_left_padding_and_the_future():
    from ftkit.engines.policy import padding_mask

    m = padding_mask(torch.tensor([0, 2]), 4)
    assert m.shape == (2, 1, 4, 4) and m.dtype == torch.bool
    causal = torch.ones(4, 4, dtype=torch.bool).triu(1)
    assert torch.equal(m[0, 0], causal)  # no padding: the causal mask alone
    visible = ~m[1, 0]  # row 1: keys 0 and 1 are pads; a pad query sees itself only
    assert visible.tolist() == [
        [True, False, False, False],
        [False, True, False, False],
        [False, False, True, False],
        [False, False, True, True],
    ]


def test_a_prompts_output_does_not_depend_on_its_padding(llama, tmp_path):
    """ftkit's megatron model of a Llama (rotary positions): each dataset prompt's next-token
    log-probs, left-padded under the task's mask, equal those of the prompt alone (float
    rounding only); without the mask the pads change them."""
    from ftkit.model.gpt import build_gpt, configure_determinism, init_local_parallel
    from ftkit.train.rl.masks import sequence_mask

    plan = config(llama, write_prompts(tmp_path / "p.jsonl"))
    task = plan.task.build()
    configure_determinism(1)
    init_local_parallel("cpu")
    model = build_gpt(plan.model, 0, "cpu").eval()
    prompts = task.heldout_prompts(0, len(PROBLEMS))
    pads = task.prompt_pads(prompts)
    assert int(pads.min()) > 0  # every prompt here is shorter than max_prompt_len
    unmasked_gap = 0.0
    with torch.no_grad():
        pos = torch.arange(prompts.shape[1]).unsqueeze(0).expand_as(prompts)
        padded = model(prompts, pos, sequence_mask(task, prompts))[..., : task.vocab_size].log_softmax(-1)
        plain = model(prompts, pos, None)[..., : task.vocab_size].log_softmax(-1)
        for i, n in enumerate(pads.tolist()):
            alone = prompts[i : i + 1, n:]
            ref = model(alone, torch.arange(alone.shape[1])[None], None)[..., : task.vocab_size].log_softmax(-1)
            assert torch.allclose(padded[i, n:], ref[0], atol=1e-5), (i, (padded[i, n:] - ref[0]).abs().max())
            unmasked_gap = max(unmasked_gap, float((plain[i, n:] - ref[0]).abs().max()))
    assert unmasked_gap > 1e-3  # the pads are seen without the mask: the check has teeth
