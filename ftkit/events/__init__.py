"""The event log: schema (pydantic union on ``type``), writer (one append-only file per process
incarnation), reader (streaming, bounded memory) and a generator of synthetic run logs."""
