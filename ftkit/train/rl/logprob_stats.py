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
from numpy.typing import ArrayLike


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


def _array(x: ArrayLike) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor: no import of torch needed to read it
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def compare_logprobs(engine: ArrayLike, trainer: ArrayLike, mask: ArrayLike) -> LogprobComparison:
    """Compare ``engine`` and ``trainer`` log-probs ``[n, s]`` on ``mask`` (see the module doc)."""
    e, t, m = _array(engine).astype(np.float32), _array(trainer).astype(np.float32), _array(mask).astype(bool)
    if not (e.shape == t.shape == m.shape) or e.ndim != 2:
        raise ValueError(f"engine {e.shape}, trainer {t.shape} and mask {m.shape} must be the same [n, s]")
    # one entry per compared token, in row-major order
    differ = (e.view(np.uint32) != t.view(np.uint32))[m]
    finite = (np.isfinite(e) & np.isfinite(t))[m]
    d = np.where(finite, t[m].astype(np.float64) - e[m].astype(np.float64), 0.0)
    absd, kl = np.abs(d), np.expm1(d) - d
    row = np.nonzero(m)[0]
    position = (np.cumsum(m, axis=1) - 1)[m]  # k-th compared token of its sample
    width = int(position.max(initial=-1)) + 1
    return LogprobComparison(
        samples=_grouped(row, m.shape[0], differ, finite, absd, kl),
        positions=_grouped(position, width, differ, finite, absd, kl),
        step=_grouped(np.zeros_like(row), 1, differ, finite, absd, kl)[0],
    )


def _grouped(
    key: np.ndarray, groups: int, differ: np.ndarray, finite: np.ndarray, absd: np.ndarray, kl: np.ndarray
) -> list[MismatchStats]:
    """``MismatchStats`` of each group ``0 .. groups-1`` of compared tokens (``key`` per token)."""
    tokens = np.bincount(key, minlength=groups)
    good = np.bincount(key, weights=finite, minlength=groups)
    ndiff = np.bincount(key, weights=differ, minlength=groups)
    abs_sum = np.bincount(key, weights=absd, minlength=groups)
    kl_sum = np.bincount(key, weights=kl, minlength=groups)
    abs_max = np.zeros(groups)
    np.maximum.at(abs_max, key, absd)  # non-finite tokens hold 0 here
    per = np.maximum(good, 1)
    return [
        MismatchStats(
            tokens=int(tokens[g]),
            differing=int(ndiff[g]),
            nonfinite=int(tokens[g] - good[g]),
            max_abs=float(abs_max[g]),
            mean_abs=float(abs_sum[g] / per[g]),
            k3=float(kl_sum[g] / per[g]),
        )
        for g in range(groups)
    ]
