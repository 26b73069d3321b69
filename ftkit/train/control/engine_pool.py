"""The inference engines of a run, restarted when they die.

``EnginePool(plan, run_dir)`` starts ``plan.config.engine.count`` engine actors
(``ftkit.train.rl.engines.EngineActor``, whatever the engine kind). ``ready()`` waits for them
and learns what they take (``weights_format``: the names, dtype and signed zeros the driver
sends and fingerprints the weights in). ``load(weights, version, total)`` has every engine load
the weights, an object in Ray's object store (a cell's ``export_weights`` return, which never
passes through the driver), each emitting ``engine_weights``;
``generate(prompts, rollout)`` gives each engine its contiguous range of whole chunks
(``engines.split``) and concatenates the answers.

An engine that dies (or errs) in either call is replaced: a new actor (its event file is the
next incarnation of ``engine-r<e>``, whose first event is ``engine_restart`` with the cause
and the failed call), re-sent the current weights (a new ``engine_weights`` of
the same version, fingerprinted like the first) and, in ``generate``, asked again for exactly
the samples it owed. A sample's response depends only on (weights, prompt, seed, rollout,
sample index), so the rollout's data does not depend on the fault. Each engine is restarted
at most ``MAX_RESTARTS`` times per call; beyond that the run fails (``RunFailed``).

The weights object lives on the exporting cell's node. If that node is lost before an engine
fetched it (``ObjectLostError``), the pool exports the same version again through ``reexport``
(the cells still hold it: weights are loaded between a rollout's last step and the next
rollout's first) and retries, without restarting the engine; the new export must have the
fingerprint total the first one was sent with, or the run fails.

An engine that does not answer is as failed as one that died: every call waits at most
``--step-timeout`` seconds (a ``hang``, a ``SIGSTOP``ped process), plus ``--heal-timeout`` for
an actor that has not answered anything yet (its process start and imports), then the engine
is killed and replaced like a dead one.

With a ``Placer`` (``ftkit.train.control.placement``), each engine asks for the node the plan gave it
(soft node affinity), a replacement for a live node with the fewest engines (a lost node's
engines move), and every engine's node is logged (``placement``) once it answers. With an
event writer, each replacement is logged first (``engine_failed``: the analyzer then excuses
the dead engine's log for ending without ``log_closed``).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import ftkit.evidence.emit as emit
from ftkit.train.control.run_end import RunFailed

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch import Tensor

    from ftkit.engines.protocol import WeightsFormat
    from ftkit.events.writer import EventWriter
    from ftkit.train.control.placement import Placer
    from ftkit.train.plan.run_plan import RunPlan

#: Restarts of one engine within one load / generate before the run gives up.
MAX_RESTARTS = 3


class EnginePool:
    """The engine actors of a run (see the module docstring)."""

    def __init__(
        self,
        plan: RunPlan,
        run_dir: str,
        placer: Placer | None = None,
        targets: dict[int, str | None] | None = None,
        events: EventWriter | None = None,
        reexport: Callable[[int], tuple[Any, str]] | None = None,
    ) -> None:
        """``reexport(version)``: ``(object ref, fingerprint total)`` of weights ``version`` exported
        again (the module docstring), or None: a lost weights object fails the engine like any error."""
        import ray

        from ftkit.train.control.cells import actor_options
        from ftkit.train.rl.engines import EngineActor

        cfg = plan.config
        self.plan, self.cfg, self.run_dir, self.placer, self.events = plan, cfg, run_dir, placer, events
        self.reexport = reexport
        options = actor_options(plan.placement.engine_resources(), plan.placement)
        self.cls: Any = ray.remote(**options, max_restarts=0)(EngineActor)
        self.actors: list[Any] = [self._spawn(e, (targets or {}).get(e)) for e in range(cfg.engine.count)]
        self.weights: tuple[Any, int, str | None] | None = None  # (object ref, version, total) the engines hold
        self.weights_format: WeightsFormat | None = None  # what the engines take (``ready``)
        self.sends: dict[tuple[int, int], int] = {}  # (engine, version) -> times sent
        self.restarts = 0
        self.engine_restarts: dict[int, int] = {}  # engine -> its restarts (placement incarnation)
        self.unplaced: set[int] = set(range(cfg.engine.count))  # engines whose node is not logged yet
        self.fresh: set[int] = set(range(cfg.engine.count))  # engines that have not answered a call yet

    def _spawn(self, e: int, target: str | None, restarted: tuple[str, str] | None = None) -> Any:
        """A new actor for engine ``e``, asking for node ``target`` (soft) when given;
        ``restarted``: ``(cause, during)`` when it replaces a failed one (``engine_restart``)."""
        if target is None:
            return self.cls.remote(self.plan, self.run_dir, e, restarted)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        strategy = NodeAffinitySchedulingStrategy(node_id=target, soft=True)
        return self.cls.options(scheduling_strategy=strategy).remote(self.plan, self.run_dir, e, restarted)

    def ready(self) -> None:
        """Wait until every engine is constructed (and log where they run); learn what they
        take (``weights_format``)."""
        import ray

        ray.get([a.ready.remote() for a in self.actors])
        self.weights_format = ray.get(self.actors[0].weights_format.remote())
        for e in range(len(self.actors)):
            self._placed(e)

    def _get(self, e: int, ref: Any) -> Any:
        """``ray.get(ref)`` of a call on engine ``e``, within its deadline (the module
        docstring); a missed deadline raises ``GetTimeoutError`` (a ``RayError``), which the
        callers handle like a dead engine."""
        import ray

        wait = self.cfg.recovery.step_timeout + (self.cfg.recovery.heal_timeout if e in self.fresh else 0.0)
        try:
            out = ray.get(ref, timeout=wait)
        except ray.exceptions.GetTimeoutError as exc:
            raise ray.exceptions.GetTimeoutError(
                f"engine {e} did not answer within {wait:g}s (--step-timeout"
                f"{' + --heal-timeout: its first call' if e in self.fresh else ''})"
            ) from exc
        self.fresh.discard(e)
        return out

    def _placed(self, e: int) -> None:
        """Log engine ``e``'s node once per actor (after it answered a call)."""
        import ray

        if self.placer is not None and e in self.unplaced:
            try:
                node = ray.get(self.actors[e].node.remote(), timeout=60)
            except ray.exceptions.RayError:  # died since it answered: its replacement is logged
                return
            self.unplaced.discard(e)
            self.placer.placed_engine(e, self.engine_restarts.get(e, 0), node)

    def forget_weights(self) -> None:
        """Drop the reference to the weights the engines hold, so that Ray frees their object
        before the next version is exported (an engine restarted before the next ``load`` would
        get no weights: call it right before exporting them)."""
        self.weights = None

    def load(self, ref: Any, version: int, total: str | None = None) -> list[str]:
        """Every engine loads the weights of object ref ``ref`` as ``version``; their fingerprint
        totals, in engine order. ``total``: the fingerprint total the weights were sent with
        (``weights_sent``), which a re-export must match."""
        self.weights = (ref, version, total)
        return [self._call(e, "load") for e in range(len(self.actors))]

    def generate(self, prompts: Tensor, rollout: int, greedy: bool = False) -> tuple[Any, Any]:
        """``(responses, logprobs)`` for ``prompts``: int64 and float32 ``[n, response_len]``
        (see the module docstring); ``greedy``: the engines' greedy decoding
        (``EngineActor.generate``)."""
        import ray
        import torch

        from ftkit.train.rl.engines import split

        ranges = [(e, a, b) for e, (a, b) in enumerate(split(prompts.shape[0], len(self.actors))) if b > a]
        refs = {e: self.actors[e].generate.remote(prompts[a:b], rollout, a, greedy) for e, a, b in ranges}
        parts = []
        for e, a, b in ranges:
            try:
                parts.append(self._get(e, refs[e]))
            except ray.exceptions.RayError as exc:
                self._restart(e, exc, "generate")
                parts.append(self._call(e, "generate", prompts[a:b], rollout, a, greedy, reload=True))
        return torch.cat([t for t, _ in parts], dim=0), torch.cat([lp for _, lp in parts], dim=0)

    def _call(self, e: int, what: str, *args: object, reload: bool = False) -> Any:
        """``load`` (the current weights) or ``generate(*args)`` on engine ``e`` (after
        reloading the current weights when ``reload``); on failure the engine is replaced,
        reloads the current weights and the call is repeated."""
        import ray

        reload = reload or what == "load"
        renewed = False
        for _ in range(MAX_RESTARTS + 1):
            loading = False
            try:
                total = None
                if reload and self.weights is not None:
                    ref, version, _ = self.weights
                    attempt = self.sends.get((e, version), 0)
                    self.sends[(e, version)] = attempt + 1
                    loading = True
                    total = self._get(e, self.actors[e].load_weights.remote(ref, version, version, attempt))
                    loading = False
                reload = False
                out = total if what == "load" else self._get(e, self.actors[e].generate.remote(*args))
                self._placed(e)
                return out
            except ray.exceptions.RayError as exc:
                if loading and not renewed and _lost(exc) and self._renew_weights():
                    renewed = True  # the engine is fine: its weights' object was lost
                else:
                    self._restart(e, exc, what)
                reload = True
        raise RunFailed(
            f"engine {e} failed {MAX_RESTARTS + 1} times in a row during {what}",
            hint="the engine's event files and `ray logs` say why it dies",
        )

    def _renew_weights(self) -> bool:
        """Export the current weights again after their object was lost (the module
        docstring); False without ``reexport``."""
        if self.reexport is None or self.weights is None:
            return False
        _, version, total = self.weights
        self.weights = None
        ref, again = self.reexport(version)
        if total is not None and again != total:
            raise RunFailed(
                f"weights version {version} exported again have fingerprint total {again}, "
                f"not the {total} they were sent with",
                hint="the cells changed between the export and the engines' load: a bug; the event log has both totals",
            )
        self.weights = (ref, version, again)
        sys.stderr.write(f"the object of weights version {version} was lost with its node; exported it again\n")
        return True

    def _restart(self, e: int, exc: BaseException, during: str) -> None:
        """Replace engine ``e`` by a new actor (the caller reloads the weights); the new engine
        logs ``engine_restart`` with the cause and the call (``during``) that failed."""
        import contextlib

        import ray

        from ftkit.train.control.run_end import raise_if_interrupted

        raise_if_interrupted()  # a call a signal cut short is the run stopping, not an engine failing
        cause = getattr(exc, "cause", None) or exc  # a RayTaskError's own first line names only the call
        first = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        sys.stderr.write(f"engine {e} failed ({type(cause).__name__}: {first[:200]}); restarting it\n")
        if self.events is not None:
            reason = f"{type(cause).__name__}: {first[:300]}"
            emit.engine_failed(self.events, engine=e, incarnation=self.engine_restarts.get(e, 0), reason=reason)
        with contextlib.suppress(Exception):  # already gone is fine
            ray.kill(self.actors[e], no_restart=True)
        self.restarts += 1
        self.engine_restarts[e] = self.engine_restarts.get(e, 0) + 1
        self.unplaced.add(e)
        self.fresh.add(e)
        target = self.placer.engine_target(e) if self.placer is not None else None
        self.actors[e] = self._spawn(e, target, (f"{type(cause).__name__}: {first[:200]}", during))

    def shutdown(self, timeout_s: float) -> None:
        """Flush the engines' logs (at most ``timeout_s``), then kill them. An engine that died
        after its last use (or does not answer) is logged ``engine_failed`` first: its log ends
        without ``log_closed``, and the analyzer excuses only a declared death."""
        import contextlib

        import ray

        from ftkit.train.control.waiting import failed_flushes

        failed: dict[int, str] = {}
        with contextlib.suppress(Exception):  # Ray itself gone: nothing can be told apart
            failed = failed_flushes({e: [a.shutdown.remote()] for e, a in enumerate(self.actors)}, timeout_s)
        for e, cause in sorted(failed.items()):
            sys.stderr.write(f"engine {e} failed after its last use ({cause})\n")
            if self.events is not None:
                incarnation = self.engine_restarts.get(e, 0)
                emit.engine_failed(self.events, engine=e, incarnation=incarnation, reason=f"at shutdown: {cause}")
        for a in self.actors:
            with contextlib.suppress(Exception):  # already gone is fine
                ray.kill(a, no_restart=True)
        self.actors = []


def _lost(exc: BaseException) -> bool:
    """Whether a failed engine call failed because an object it takes was lost (its node died,
    or its owner), not because of the engine."""
    import ray

    lost = ray.exceptions.ObjectLostError
    return isinstance(exc, lost) or isinstance(getattr(exc, "cause", None), lost)
