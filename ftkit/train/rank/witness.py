"""Sample witnesses of ``ftkit train``'s ranks: the table lives in ``ftkit.evidence.witness_table``
(one implementation for ftkit's trainer and every other trainer); see that module's contract."""

from ftkit.evidence.witness_table import WitnessTable  # noqa: F401 - re-exported
