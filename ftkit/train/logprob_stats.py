"""Engine vs trainer log-probs of the same tokens: per-sample, per-position and step statistics.

``compare_logprobs(engine, trainer, mask)`` takes two ``[n, s]`` arrays of per-token log-probs
(numpy arrays or CPU torch tensors) of the *same* tokens, the engine's as it sampled them and the
trainer's recomputed under the same weights version, and a ``[n, s]`` mask of the tokens to
compare (the learned response tokens). It reports, per sample, per response position and for
the whole step:

* ``tokens``: compared tokens; ``differing``: tokens whose two float32 values are not the same
  bits (exact: no tolerance; ``-0.0`` and ``0.0`` differ, as bits do); ``nonfinite``: tokens
  where either value is NaN or infinite (counted as differing, left out of the figures below);
* ``max_abs`` / ``mean_abs``: of ``|engine - trainer|`` (float64 arithmetic on the float32 values);
* ``k3``: the mean of ``exp(d) - d - 1`` with ``d = trainer - engine``, the k3 estimate of
  KL(engine || trainer) from tokens the engine sampled (>= 0, 0 when equal).

A *position* is the k-th compared token of a sample (k = 0 is the first response token: prompts
are left-padded to a fixed width, so every response starts at the same column); position
statistics aggregate over the samples that reach that position, which shows a mismatch that
grows along the response or sits at its first token (a template or shift error). Everything is
a pure function of the inputs; results are plain dataclasses of Python numbers (``as_dict``), for
the event log and the analyzer.

This module imports nothing from ``ftkit.train`` (numpy only).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class MismatchStats:
    """The statistics of one group of compared tokens (a sample, a position or the step)."""

    tokens: int
    differing: int
    nonfinite: int
    max_abs: float
    mean_abs: float
    k3: float


@dataclass(frozen=True)
class LogprobComparison:
    """``samples[i]`` for sample ``i``, ``positions[k]`` for response position ``k``, ``step`` overall."""

    samples: list[MismatchStats]
    positions: list[MismatchStats]
    step: MismatchStats

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _array(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor: no import of torch needed to read it
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def compare_logprobs(engine: Any, trainer: Any, mask: Any) -> LogprobComparison:
    """Compare ``engine`` and ``trainer`` log-probs ``[n, s]`` on ``mask`` (see the module doc)."""
    e, t, m = _array(engine).astype(np.float32), _array(trainer).astype(np.float32), _array(mask).astype(bool)
    if not (e.shape == t.shape == m.shape) or e.ndim != 2:
        raise ValueError(f"engine {e.shape}, trainer {t.shape} and mask {m.shape} must be the same [n, s]")
    differ = m & (e.view(np.uint32) != t.view(np.uint32))
    finite = m & np.isfinite(e) & np.isfinite(t)
    d = np.where(finite, t.astype(np.float64) - e.astype(np.float64), 0.0)
    absd = np.abs(d)
    kl = np.where(finite, np.expm1(d) - d, 0.0)
    rank = np.cumsum(m, axis=1) - 1  # k-th compared token of its sample
    width = int(rank.max(initial=-1)) + 1
    samples = [_stats(m[i], differ[i], finite[i], absd[i], kl[i]) for i in range(m.shape[0])]
    positions = [_stats(*(a[(rank == k) & m] for a in (m, differ, finite, absd, kl))) for k in range(width)]
    return LogprobComparison(samples, positions, _stats(m, differ, finite, absd, kl))


def _stats(sel: np.ndarray, differ: np.ndarray, finite: np.ndarray, absd: np.ndarray, kl: np.ndarray) -> MismatchStats:
    tokens, good = int(sel.sum()), int(finite.sum())
    return MismatchStats(
        tokens=tokens,
        differing=int(differ.sum()),
        nonfinite=tokens - good,
        max_abs=float(absd[finite].max()) if good else 0.0,
        mean_abs=float(absd[finite].sum() / good) if good else 0.0,
        k3=float(kl[finite].sum() / good) if good else 0.0,
    )
