"""The event log schema: one pydantic model per event type, one discriminated union on ``type``.

The event log is a public, versioned contract: external tools write and read it, so the field
names below never change; new fields and new types may be added. Schema 2 adds ``log_closed``:
every writer that closes normally says so in its last line, so a log cut at a line boundary is
told apart from a process that died (the driver declares deaths). Readers accept schema 1 logs
(without ``log_closed``) and hold them to everything else. Every line is one
JSON object carrying the envelope (:class:`Envelope`) plus the fields of its type. Models allow
extra fields (forward compatibility); readers skip unknown types with a warning.

The envelope every line carries (``Envelope``, ``Source``, the schema versions) is
``ftkit.events.envelope``. ``parse_event(obj)`` validates one decoded line fully (the
analyzer does this lazily, only for lines its fast path rejects); ``ftkit.events.schema_doc.schema_markdown()`` renders
``docs/event-schema.md`` deterministically from the models.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from ftkit.events.envelope import CellStatus, Envelope, Hex


class RunStarted(Envelope):
    """The driver started a run."""

    type: Literal["run_started"]
    config: dict[str, Any] = Field(description="the full training configuration")
    num_cells: int = Field(description="cells requested")
    tp: int = Field(description="tensor-parallel size inside a cell")
    pp: int = Field(description="pipeline-parallel size inside a cell")
    num_engines: int = Field(description="inference engines")
    ftkit_version: str = Field(description="version of ftkit that wrote the run")
    fingerprint_scheme: Literal["ftkit-fp1", "ftkit-fp2"] = Field(
        default="ftkit-fp1",
        description="how every fingerprint of the run is computed (docs/fingerprints.md); absent: "
        "`ftkit-fp1`, what versions before the field wrote",
    )


class RunResumed(RunStarted):
    """The driver resumed a run in its run directory (a later session of the same run, in place of
    ``run_started``): the steps up to ``checkpoint_step`` were committed by earlier sessions and
    their state was loaded from that checkpoint; what the earlier sessions logged after it is
    superseded (it is trained again here, bitwise the same)."""

    type: Literal["run_resumed"]  # type: ignore[assignment]
    checkpoint: str | None = Field(description="the checkpoint loaded (its directory name); null: none, from the seed")
    checkpoint_step: int = Field(description="the last step the checkpoint holds (-1: none)")
    checkpoint_rollout: int = Field(description="the rollout the checkpoint ends (-1: none)")
    skipped: list[str] = Field(description="newer checkpoints skipped, with why (each also a warning)")
    layout_change: dict[str, list[int]] | None = Field(
        default=None,
        description="set only when this session changed the TP x PP layout (--allow-layout-change): "
        "{field: [recorded, now]}; from here on the run is not bitwise the uninterrupted run",
    )
    precision_change: list[str] | None = Field(
        default=None, description="set only when this session changed the precision: [recorded, now] (as layout_change)"
    )


class RunFinished(Envelope):
    """The driver finished a run; nothing may be logged after it."""

    type: Literal["run_finished"]
    status: Literal["completed", "failed", "interrupted"] = Field(description="how the run ended")
    reason: str | None = Field(default=None, description="why, for failed / interrupted runs")


class CellStateEvent(Envelope):
    """A cell changed state in the driver's state machine."""

    type: Literal["cell_state"]
    cell: int = Field(description="the cell")
    old: CellStatus = Field(description="previous state")
    new: CellStatus = Field(description="new state")
    reason: str | None = Field(default=None, description="why it changed")


class Reconfigure(Envelope):
    """The cross-cell groups were rebuilt for a new alive set (a new epoch)."""

    type: Literal["reconfigure"]
    epoch: int = Field(description="the new epoch; steps of this membership carry it")
    alive_before: list[int] = Field(description="alive cells of the previous epoch")
    alive_after: list[int] = Field(description="alive cells of the new epoch")
    reason: str | None = Field(default=None, description="why")


class StepOutcome(Envelope):
    """What one rank of one cell did with one attempt of an optimizer step."""

    type: Literal["step_outcome"]
    rollout: int = Field(description="rollout index")
    step: int = Field(description="run-global optimizer step (a retry keeps it)")
    attempt: int = Field(description="attempt of this step, from 0")
    epoch: int = Field(description="membership epoch the attempt ran in")
    cell: int = Field(description="the cell")
    rank: int | None = Field(default=None, description="rank in the cell (default: source.rank)")
    outcome: Literal["committed", "discarded", "failed"] = Field(description="the result")
    micro_shards: list[int] = Field(description="micro-shards this cell computed")


class StateFingerprint(Envelope):
    """Fingerprint of one rank's full state after a committed step."""

    type: Literal["state_fingerprint"]
    rollout: int = Field(description="rollout index")
    step: int = Field(description="run-global optimizer step")
    attempt: int = Field(description="the committed attempt")
    cell: int = Field(description="the cell")
    rank: int | None = Field(default=None, description="rank in the cell (default: source.rank)")
    total: Hex = Field(description="order-independent fingerprint of params and optimizer state")
    params: dict[str, Hex] = Field(description="fingerprint per parameter")
    optimizer: dict[str, Hex] = Field(description="fingerprint per optimizer state tensor")
    weights: dict[str, Hex] | None = Field(
        default=None, description="bf16 runs: fingerprint per bf16 weight (params cast; FT102's), not in total"
    )


class WitnessAllocated(Envelope):
    """Witness ids allocated to a rollout's samples."""

    type: Literal["witness_allocated"]
    rollout: int = Field(description="rollout index")
    attempt: int = Field(description="allocation attempt (the latest one counts)")
    ids: list[int] = Field(description="one id per sample, in sample order")
    expected: int = Field(description="count each id must reach over the rollout (usually 1)")


class WitnessCounts(Envelope):
    """Per-sample witness counts read from one step attempt's reduced gradient."""

    type: Literal["witness_counts"]
    rollout: int = Field(description="rollout index")
    step: int = Field(description="run-global optimizer step")
    attempt: int = Field(description="attempt of the step")
    cell: int = Field(description="the reporting cell (every cell sees the same global counts)")
    rank: int | None = Field(default=None, description="reporting rank (default: source.rank)")
    ids: list[int] = Field(description="witness ids with a non-zero count")
    counts: list[int] = Field(description="count per id")
    contributions: list[float] = Field(description="loss contribution channel per id")


class WeightsSent(Envelope):
    """The driver pushed a weights version to the engines."""

    type: Literal["weights_sent"]
    rollout: int = Field(description="rollout index")
    version: int = Field(description="weights version")
    total: Hex = Field(description="fingerprint of the weights sent")
    params: dict[str, Hex] = Field(description="fingerprint per parameter")


class EngineWeights(Envelope):
    """An inference engine reports what it loaded."""

    type: Literal["engine_weights"]
    rollout: int = Field(description="rollout index")
    version: int = Field(description="weights version loaded")
    engine: int = Field(description="engine index")
    total: Hex = Field(description="fingerprint of the loaded weights")
    params: dict[str, Hex] = Field(description="fingerprint per parameter")


class EngineRestart(Envelope):
    """A replaced inference engine started (written by the new engine, first in its log)."""

    type: Literal["engine_restart"]
    engine: int = Field(description="engine index")
    cause: str = Field(description="why the driver replaced the previous engine (its error, first line)")
    during: str = Field(description="the driver's call that failed: load or generate")


_STEP = "ftkit train's per-step metric only, absent in older logs (docs/train.md \"Where a step's time goes\")"


class Metric(Envelope):
    """Scalar metrics of a step (loss, grad_norm, reward, ...). ``ftkit train`` logs per rollout
    the reward's mean / std / min / max, ``zero_advantage_groups``, response lengths,
    ``truncated_fraction`` and ``gen_tokens_per_s``; per step loss, grad_norm, ``tokens_per_s``
    (training) and, with GRPO, entropy, clip_fraction, kl and the engine-vs-trainer
    ``logprob_diff_*`` (docs/rl.md "Metrics")."""

    type: Literal["metric"]
    rollout: int = Field(description="rollout index")
    step: int | None = Field(description="run-global optimizer step (null: per rollout)")
    values: dict[str, float | None] = Field(
        description='name -> value (NaN / Infinity literals allowed); ftkit train\'s names: docs/rl.md "Metrics"'
    )
    phases: dict[str, float] | None = Field(default=None, description=f"phase -> seconds of the step; {_STEP}")
    wall_seconds: float | None = Field(default=None, description=f"the wall seconds the phases cover; {_STEP}")
    micro_shard_seconds: list[float | None] | None = Field(default=None, description=f"per micro-shard; {_STEP}")


class FaultInjected(Envelope):
    """A fault was injected on purpose (fault schedule)."""

    type: Literal["fault_injected"]
    kind: str = Field(description="what was injected (sigkill, exit, exception, hang, nan-grad, slow, ...)")
    point: str = Field(description="where in the step it struck (before_forward, during_reduce, ...)")
    cell: int | None = Field(description="target cell")
    rank: int | None = Field(description="target rank")
    rollout: int | None = Field(description="rollout index")
    step: int | None = Field(description="run-global optimizer step")
    attempt: int | None = Field(default=None, description="attempt of the step, heal or weight sync it struck")
    engine: int | None = Field(default=None, description="target engine (engine faults)")


class Heal(Envelope):
    """A restarted cell received the full state from a live donor."""

    type: Literal["heal"]
    cell: int = Field(description="the healed cell")
    donor: int = Field(description="the donor cell")
    epoch: int = Field(description="epoch the healed cell joins")
    bytes: int = Field(description="state bytes transferred")
    seconds: dict[str, float] = Field(description="phase -> seconds")
    total: Hex = Field(description="fingerprint of the state the healed cell holds")
    donor_total: Hex = Field(description="fingerprint of the donor's state")


class GradNonfinite(Envelope):
    """A rank found a non-finite gradient (the step is discarded)."""

    type: Literal["grad_nonfinite"]
    rollout: int = Field(description="rollout index")
    step: int = Field(description="run-global optimizer step")
    cell: int = Field(description="the cell")
    rank: int | None = Field(description="the rank")
    where: str = Field(description="which tensor or stage")


class CheckpointPublished(Envelope):
    """A checkpoint was published (its manifest written)."""

    type: Literal["checkpoint_published"]
    step: int = Field(description="run-global optimizer step of the checkpoint")
    path: str = Field(description="checkpoint directory")
    kind: Literal["latest", "best", "ema"] = Field(description="which slot")
    metric: float | None = Field(description="the ranking metric")
    manifest_sha256: str = Field(description="sha256 of MANIFEST.json")
    guard_from_step: int = Field(description="first step of the finiteness guard interval")
    guard_to_step: int = Field(description="last step of the finiteness guard interval")
    bytes: int | None = Field(default=None, description="payload bytes published")
    kept: list[str] | None = Field(default=None, description="checkpoints retention keeps after this one")
    dropped: list[str] | None = Field(default=None, description="checkpoints retention dropped (being deleted)")


class CheckpointRejected(Envelope):
    """A checkpoint was not published (guard or verification failed)."""

    type: Literal["checkpoint_rejected"]
    step: int = Field(description="run-global optimizer step")
    kind: str = Field(description="which slot")
    reason: str = Field(description="why")


class CheckpointCleanupFailed(Envelope):
    """A checkpoint retention dropped could not be deleted (recorded in the journal; retried)."""

    type: Literal["checkpoint_cleanup_failed"]
    step: int | None = Field(description="step of the publication whose cleanup failed (null: a reconcile)")
    path: str = Field(description="the checkpoint directory left behind")
    error: str = Field(description="the error")


class DumpWritten(Envelope):
    """A tensor dump file was written."""

    type: Literal["dump_written"]
    rollout: int = Field(description="rollout index")
    step: int | None = Field(
        default=None, description="run-global optimizer step of a per-step dump (null: per rollout)"
    )
    phase: str = Field(description="dump phase")
    path: str = Field(description="safetensors file")
    tensors: int = Field(description="tensors in the file")
    bytes: int = Field(description="file size")


class EventsDropped(Envelope):
    """The writer could not write some lines (reported on close; the seq gap shows where)."""

    type: Literal["events_dropped"]
    count: int = Field(description="lines that could not be written")
    last_error: str = Field(description="the last error")


class LogClosed(Envelope):
    """A writer closed normally (schema 2): always its last line. A schema 2 log that ends without
    it was cut, unless the driver declared its process dead."""

    type: Literal["log_closed"]
    lines: int = Field(description="lines this writer emitted before this one (equals this line's seq)")
    dropped: int = Field(description="of those, lines that could not be written")
    peak_rss_bytes: int | None = Field(
        default=None, description="the writing process's peak resident memory so far (ru_maxrss); absent: not known"
    )


class PlacementEvent(Envelope):
    """Where one rank of a cell or one engine runs (the driver logs it once the actor's
    placement is known: at start, and for every restart)."""

    type: Literal["placement"]
    role: Literal["trainer", "engine"] = Field(description="a rank of a cell or an inference engine")
    cell: int | None = Field(default=None, description="the cell (role trainer)")
    rank: int | None = Field(default=None, description="rank in the cell (role trainer)")
    engine: int | None = Field(default=None, description="the engine (role engine)")
    incarnation: int = Field(description="incarnation of the cell or restart count of the engine, from 0")
    node_id: str = Field(description="Ray node id (hex) the actor runs on")
    address: str = Field(description="that node's address (Ray's NodeManagerAddress)")
    planned_node_id: str | None = Field(
        default=None, description="the node the spread asked for (null: no preference); differs when Ray fell back"
    )


class EngineFailed(Envelope):
    """The driver found an engine dead or failing and replaces it (its log may end without
    ``log_closed``: a lost node takes the process with it)."""

    type: Literal["engine_failed"]
    engine: int = Field(description="the engine")
    incarnation: int = Field(description="restarts of this engine before this failure (its event file's i<n>)")
    reason: str = Field(description="what the driver saw")


class LogprobMismatch(BaseModel):
    """Engine vs trainer log-probs of one group of compared tokens (``ftkit.train.rl.logprob_stats``)."""

    model_config = ConfigDict(extra="allow")
    tokens: int = Field(ge=0, description="compared tokens")
    differing: int = Field(ge=0, description="tokens whose two float32 log-probs are not the same bits")
    nonfinite: int = Field(ge=0, description="tokens where either value is NaN or infinite (counted as differing)")
    max_abs: float = Field(description="max |engine - trainer| over the finite tokens")
    mean_abs: float = Field(description="mean |engine - trainer| over the finite tokens")
    k3: float = Field(description="mean k3 estimate of KL(engine || trainer) over the finite tokens")


class LogprobCheck(Envelope):
    """A rank recomputed the policy's log-probs of its samples at a rollout's first step (the
    weights the engines sampled with) and compared them with the engines' recorded ones."""

    type: Literal["logprob_check"]
    rollout: int = Field(description="rollout index")
    step: int = Field(description="optimizer step (the rollout's first)")
    attempt: int = Field(default=0, description="attempt of the step")
    cell: int = Field(description="the cell")
    rank: int = Field(description="rank inside the cell")
    version: int = Field(description="weights version the rollout was sampled with")
    witness_ids: list[int] = Field(description="the samples compared, in order")
    samples: list[LogprobMismatch] = Field(description="per sample, in witness_ids order")
    positions: list[LogprobMismatch] = Field(description="per response position k (0: the first response token)")
    total: LogprobMismatch = Field(description="over all compared tokens")


class CanaryLogprobs(Envelope):
    """The fixed canary set scored under a weights version (``ftkit.train.rl.canary``): by an
    engine right after it loaded the version, or by a cell's trainer at the first step of the
    rollout that version generated."""

    type: Literal["canary_logprobs"]
    rollout: int = Field(description="rollout index (the rollout the version generates)")
    version: int = Field(description="weights version scored")
    engine: int | None = Field(default=None, description="the engine (engines' events)")
    cell: int | None = Field(default=None, description="the cell (trainers' events)")
    rank: int | None = Field(default=None, description="rank inside the cell (trainers' events)")
    rows: int = Field(ge=1, description="canary sequences scored")
    logprobs: list[float] = Field(description="the policy's log-probs of their response tokens, row-major")


#: Evidence kinds a producer may promise in ``evidence_profile`` (kind -> the rules it covers is
#: ``ftkit.analysis.profile.COVERS``). ``step_outcome`` is not a kind: every producer logs it.
EVIDENCE_KINDS = ("state_fingerprint", "witness_counts", "metric", "dump_written", "checkpoint", "weights")


class EvidenceProfileEvent(Envelope):
    """The evidence a producer other than ``ftkit train`` promises (logged by its driver role right
    after ``run_started``). ``analyze-events`` then expects exactly that, fails closed on anything
    promised and missing (FT112), and reports every rule whose evidence was not promised as not
    covered. A log without this event is held to everything ``ftkit train`` logs."""

    type: Literal["evidence_profile"]
    producer: str = Field(description="who writes the log (ftkit.evidence, ftkit.integrations.transformers, ...)")
    kinds: dict[str, int] = Field(
        description="evidence kind -> cadence N: due at every committed step s with (s + 1) % N == 0 "
        "(weights: at every weight sync); kinds are " + ", ".join(f"`{k}`" for k in EVIDENCE_KINDS)
    )


EVENT_MODELS: tuple[type[Envelope], ...] = (
    RunStarted,
    RunResumed,
    RunFinished,
    CellStateEvent,
    Reconfigure,
    StepOutcome,
    StateFingerprint,
    WitnessAllocated,
    WitnessCounts,
    WeightsSent,
    EngineWeights,
    EngineRestart,
    Metric,
    FaultInjected,
    Heal,
    GradNonfinite,
    CheckpointPublished,
    CheckpointRejected,
    CheckpointCleanupFailed,
    DumpWritten,
    EventsDropped,
    LogClosed,
    PlacementEvent,
    EngineFailed,
    EvidenceProfileEvent,
    LogprobCheck,
    CanaryLogprobs,
)
EVENT_TYPES: dict[str, type[Envelope]] = {get_args(m.model_fields["type"].annotation)[0]: m for m in EVENT_MODELS}
Event = Annotated[Union[EVENT_MODELS], Field(discriminator="type")]  # type: ignore[valid-type]  # noqa: UP007


@functools.cache
def _adapter() -> TypeAdapter[Any]:
    """The validator of ``Event``, built on first use (the models are ``defer_build`` too): building
    every model's validator at import costs a small log's analysis, which needs them only for the
    lines its fast path rejects."""
    return TypeAdapter(Event)


def parse_event(obj: Any) -> Envelope:
    """Validate one decoded line strictly (no coercion); raises ``pydantic.ValidationError``
    (unknown types included)."""
    event: Envelope = _adapter().validate_python(obj, strict=True)
    return event
