"""Two runs compared step by step from their event logs (``ftkit compare-runs``).

``ftkit.runs.compare.compare_runs`` is the entry point: each run's log is replayed through
``analyze-events``' reader and integrity rules (``side``), its committed evidence gathered
(``ledger``) and matched with the other run's as both logs stream in (``matcher``), the values
compared (``diff``) and the configs' differences listed, the result-determining ones first
(``configs``). Finding codes: ``codes`` (CR001-CR008, docs/compare-runs.md).
"""
