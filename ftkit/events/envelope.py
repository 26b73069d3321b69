"""The envelope every event line carries (``Envelope``: schema, type, run, time, source, seq;
``Source``: the writing process incarnation), the schema versions a reader understands, and the
small types the event models of ``ftkit.events.schema`` share (``Hex``, ``CellStatus``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA = 2
SCHEMAS = (1, 2)  # versions this reader understands
Role = Literal["driver", "trainer", "engine", "tool"]
#: States in which the driver declares a cell dead (``errored``: schema-1 logs; ``failed``: the
#: fault-tolerant driver, which then restarts and heals it).
DEAD_STATES = frozenset({"errored", "failed"})
CellStatus = Literal["pending", "starting", "alive", "errored", "stopped", "failed", "restarting", "healing"]
Hex = Annotated[str, Field(description="lowercase hex digest")]


class Source(BaseModel):
    """Who wrote the line: one process incarnation (one file under ``events/``)."""

    model_config = ConfigDict(extra="allow", defer_build=True)
    role: Role = Field(description="driver, trainer (a rank), engine or tool")
    cell: int | None = Field(description="cell index, null for the driver / tools")
    rank: int | None = Field(description="rank inside the cell (trainers), engine index (engines), else null")
    incarnation: int = Field(description="restart count of this (role, cell, rank), from 0")
    pid: int = Field(description="process id")
    host: str = Field(description="host name")


class Envelope(BaseModel):
    """Fields on every line."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, serialize_by_alias=True, defer_build=True)
    schema_: Literal[1, 2] = Field(alias="schema", description="schema version of the line (2; 1 is still read)")
    type: str = Field(description="event type (the discriminator)")
    run: str = Field(description="run name")
    time: float = Field(description="unix seconds when the line was written")
    source: Source = Field(description="the writing process incarnation")
    seq: int = Field(ge=0, description="from 0 per source incarnation, without gaps")
