"""Reward plug-ins: load by name, validate the contract, score a rollout, check determinism.

``load_reward(spec)`` resolves, in this order: a built-in name (``builtin_rewards.BUILTINS``), a
``module:function`` (the module imported from the working directory or ``sys.path``; a dotted
function path such as ``mod:Class.method`` works), an installed plug-in registered in the
``ftkit.rewards`` entry-point group under that name. The function's signature is checked at
load time: it must accept the keywords of ``protocols.RewardFn`` (``prompt``, ``response``,
``label``, ``prompt_ids``, ``response_ids``; ``**kwargs`` covers any of them) and need nothing
else; a spec that does not resolve or a function that cannot be called so is a
``ConfigError`` (exit 2) with the reason.

``score(reward, samples, timeout)`` calls the plug-in once per sample. A plug-in that raises, or
returns a non-number or a non-finite number, fails the rollout with ``RewardError`` (exit 2, a
user error, never an internal one) naming the plug-in, the sample index and what it did; so does a
call that has not returned after ``timeout`` seconds (``--reward-timeout``; the call is stopped,
``ftkit.tasks.time_limit``), which names the sample's prompt too.

Rewards must be deterministic. ``check_determinism`` scores a fixed subset twice in the same
process; ``compare_rewards`` rescores recorded samples (a resumed or retried rollout) and lists
every sample whose score is not the recorded one bit for bit. Both report; the caller decides
(the run records a finding), nothing is hidden or averaged away.
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
import struct
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from ftkit.errors import ConfigError, FtkitError
from ftkit.tasks.builtin_rewards import BUILTINS
from ftkit.tasks.protocols import RewardSample
from ftkit.tasks.time_limit import TimeLimitExceeded, call_within

ENTRY_POINT_GROUP = "ftkit.rewards"
CONTRACT_KEYWORDS = ("prompt", "response", "label", "prompt_ids", "response_ids")
_HINT = "a reward is a built-in name, module:function (importable from here or sys.path) or an installed plug-in"


class RewardError(FtkitError):
    """A reward plug-in failed on a sample of a rollout (exit 2): raised, returned a non-number
    or a non-finite value, or did not return in time. ``reward`` and ``index`` say which and
    where; ``prompt`` (the sample's prompt text, shortened) is named too when given."""

    def __init__(
        self,
        reward: str,
        index: int,
        what: str,
        prompt: str | None = None,
        hint: str = "a reward must return a finite float for every sample; fix the plug-in and rerun",
    ) -> None:
        where = f"sample {index}" if prompt is None else f"sample {index} (prompt {_short(prompt)!r})"
        super().__init__(f"reward {reward!r} {what} on {where}", hint=hint)
        self.reward = reward
        self.index = index


@dataclass(frozen=True)
class LoadedReward:
    """A reward whose signature was checked: ``name`` is the spec it was loaded by."""

    name: str
    fn: Callable[..., Any]


@dataclass(frozen=True)
class RewardMismatch:
    """A sample whose score moved: index in the rollout, the two scores."""

    index: int
    first: float
    second: float


def load_reward(spec: str) -> LoadedReward:
    """The reward ``spec`` names, signature-checked (``ConfigError`` with the reason otherwise)."""
    if spec in BUILTINS:
        fn: Any = BUILTINS[spec].fn
    elif ":" in spec:
        fn = _from_module(spec)
    else:
        fn = _from_entry_point(spec, sorted(BUILTINS))
    check_signature(spec, fn)
    return LoadedReward(spec, fn)


def check_signature(name: str, fn: Any) -> None:
    """``ConfigError`` unless ``fn`` can be called with exactly the contract's keywords."""
    if not callable(fn):
        raise ConfigError(f"reward {name!r} is a {type(fn).__name__}, not a function", hint=_HINT)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"reward {name!r} has no inspectable signature ({e})", hint=_HINT) from None
    try:
        sig.bind(**dict.fromkeys(CONTRACT_KEYWORDS))
    except TypeError as e:
        raise ConfigError(
            f"reward {name!r} cannot be called as fn({', '.join(f'{k}=...' for k in CONTRACT_KEYWORDS)}): {e}",
            hint="declare those keyword parameters (or **kwargs) and no other required ones",
        ) from None


def score(reward: LoadedReward, samples: Sequence[RewardSample], timeout: float | None = None) -> list[float]:
    """The reward of each sample, in order; ``RewardError`` on the first failing sample."""
    return [score_one(reward, i, s, timeout) for i, s in enumerate(samples)]


def score_one(reward: LoadedReward, index: int, sample: RewardSample, timeout: float | None = None) -> float:
    """The reward of one sample (``index`` is its place in the rollout, for the error). A call
    that has not returned after ``timeout`` seconds (``None``: no limit) is stopped and is a
    ``RewardError`` (``ftkit.tasks.time_limit``: enforced in the main thread, where ``ftkit train``
    scores)."""
    try:
        value = call_within(timeout, reward.fn, **sample.kwargs())
    except FtkitError:  # ftkit's own, e.g. the RunInterrupted a signal raised meanwhile: not the plug-in's
        raise
    except TimeLimitExceeded as e:
        raise RewardError(
            reward.name,
            index,
            f"{e} (--reward-timeout)",
            prompt=sample.prompt,
            hint="make the plug-in return sooner (a network call, a subprocess, a loop that never ends?), "
            "or give it more time with --reward-timeout SECONDS",
        ) from None
    except (Exception, SystemExit) as e:  # a plug-in's own failure (sys.exit too), with its name and sample
        raise RewardError(reward.name, index, f"raised {type(e).__name__}: {e}") from e
    if not isinstance(value, numbers.Real):
        raise RewardError(reward.name, index, f"returned a {type(value).__name__}, not a float")
    out = float(value)
    if not math.isfinite(out):
        raise RewardError(reward.name, index, f"returned {out}")
    return out


def determinism_subset(n: int, count: int = 8) -> list[int]:
    """``count`` sample indices spread evenly over ``n`` (a function of ``n`` and ``count`` only)."""
    if n <= count:
        return list(range(n))
    return [i * n // count for i in range(count)]


def check_determinism(
    reward: LoadedReward, samples: Sequence[RewardSample], count: int = 8, timeout: float | None = None
) -> list[RewardMismatch]:
    """Score ``determinism_subset`` of ``samples`` twice (each call limited to ``timeout``
    seconds); the samples whose two scores differ."""
    idx = determinism_subset(len(samples), count)
    first = [score_one(reward, i, samples[i], timeout) for i in idx]
    second = [score_one(reward, i, samples[i], timeout) for i in idx]
    return [RewardMismatch(i, a, b) for i, a, b in zip(idx, first, second) if not same_bits(a, b)]


def compare_rewards(
    reward: LoadedReward, samples: Sequence[RewardSample], recorded: Sequence[float]
) -> list[RewardMismatch]:
    """Rescore ``samples`` and list those whose score is not ``recorded`` bit for bit
    (``first`` is the recorded score, ``second`` the new one)."""
    if len(samples) != len(recorded):
        raise ValueError(f"{len(samples)} samples but {len(recorded)} recorded rewards")
    out = []
    for i, (s, old) in enumerate(zip(samples, recorded)):
        new = score_one(reward, i, s)
        if not same_bits(float(old), new):
            out.append(RewardMismatch(i, float(old), new))
    return out


def same_bits(a: float, b: float) -> bool:
    """Whether two floats are the same float64 bits (so 0.0 and -0.0 differ; NaN never occurs)."""
    return struct.pack("<d", a) == struct.pack("<d", b)


def _short(text: str, most: int = 80) -> str:
    """``text`` cut to ``most`` characters (an ellipsis says it was)."""
    return text if len(text) <= most else text[: most - 1] + "…"


def _from_module(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"reward {spec!r} is not module:function", hint=_HINT)
    if "" not in sys.path:  # the working directory, as `python -m` would have it
        sys.path.insert(0, "")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # an import error or the module's own failure at import
        raise ConfigError(f"cannot import reward module {module_name!r}: {type(e).__name__}: {e}", hint=_HINT) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"reward module {module_name!r} has no attribute {attr!r}", hint=_HINT)
        obj = getattr(obj, part)
    return obj


def _from_entry_point(name: str, builtins: list[str]) -> Any:
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        installed = sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
        raise ConfigError(
            f"unknown reward {name!r}; built-ins: {', '.join(builtins)}; "
            f"installed plug-ins ({ENTRY_POINT_GROUP}): {', '.join(installed) or 'none'}",
            hint=_HINT,
        )
    try:
        return found[0].load()
    except Exception as e:  # the plug-in's package failed to import
        raise ConfigError(f"cannot load reward plug-in {name!r} ({found[0].value}): {e}", hint=_HINT) from None
