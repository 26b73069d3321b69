"""The event log: schema (pydantic union on ``type``), writer (one append-only file per process
incarnation) and reader (streaming, bounded memory)."""
