"""The evidence API: ftkit's forensics for any trainer (torch only; never megatron or Ray).

    import ftkit
    run = ftkit.EvidenceRun(args.out, ftkit.EvidenceProfile(checkpoint_every=10))
    run.allocate(epoch, range(len(dataset)))                    # the samples of a rollout
    ...  loss.backward(); ok = run.observe_grads(step, model); optimizer.step()
    run.step(step, model=model, optimizer=optimizer, samples=batch_ids, metrics={"loss": loss})
    run.close()

A restarted job passes ``resume=True`` and calls ``run.restore(model, optimizer)``
(``ftkit.evidence.resume``). Then ``ftkit analyze-events RUN/events``, ``ftkit compare-dumps``
and ``ftkit verify-checkpoint`` read the run as one of ``ftkit train``'s. See docs/library.md
(the contract of each call, the evidence profile, what each rule needs).
"""

from ftkit.evidence.engines import EngineLog, weights_fingerprint
from ftkit.evidence.fingerprint import fingerprint_state, named_state, unwrap
from ftkit.evidence.profile import EvidenceProfile
from ftkit.evidence.resume import ResumePoint
from ftkit.evidence.run import EvidenceRun
from ftkit.evidence.witness_table import WitnessTable

__all__ = [
    "EngineLog",
    "EvidenceProfile",
    "EvidenceRun",
    "ResumePoint",
    "WitnessTable",
    "fingerprint_state",
    "named_state",
    "unwrap",
    "weights_fingerprint",
]
