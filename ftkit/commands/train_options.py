"""The options of ``ftkit train`` derived from ``TrainConfig``: their help panels, the str Enums
of the config's Literal fields, ``opt`` (a Typer option whose help is the field's description
and default) and ``given_values`` (the config values a command line gave). Kept apart from the
command (``ftkit.commands.train``) so that its signature, one parameter per option, is all it
holds besides the run."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any, TypeAlias

import typer

PANEL = "Training"
PANEL_DUMPS = "Dumps"
PANEL_FAULTS = "Fault tolerance"
PANEL_CKPT = "Checkpoints"
PANEL_RL = "RL objective"
PANEL_DATA = "Prompts"
PANEL_SAMPLING = "Sampling"


def _choices(name: str, field: str) -> type[Enum]:
    """A str Enum of the values a ``TrainConfig`` Literal field admits (Typer needs an Enum
    for choices; deriving it keeps the command line and the config from drifting apart)."""
    import typing

    from ftkit.train.config.run import leaves

    values = typing.get_args(leaves()[field].info.annotation)
    return Enum(name, {v: v for v in values}, type=str)  # type: ignore[return-value]


if TYPE_CHECKING:  # built at run time; to a type checker each is a str Enum
    Reduce: TypeAlias = Enum
    Device: TypeAlias = Enum
    Precision: TypeAlias = Enum
    DumpCells: TypeAlias = Enum
    BestMetric: TypeAlias = Enum
    Loss: TypeAlias = Enum
    Aggregation: TypeAlias = Enum
    EngineKind: TypeAlias = Enum
    EnginePlacement: TypeAlias = Enum
else:
    Reduce = _choices("Reduce", "reduce")
    Device = _choices("Device", "device")
    Precision = _choices("Precision", "precision")
    DumpCells = _choices("DumpCells", "dump_cells")
    BestMetric = _choices("BestMetric", "best_metric")
    Loss = _choices("Loss", "loss")
    Aggregation = _choices("Aggregation", "aggregation")
    EngineKind = _choices("EngineKind", "engine_kind")
    EnginePlacement = _choices("EnginePlacement", "engine_placement")


def opt(*names: str, field: str | None = None, help: str = "", panel: str = PANEL, **kw: Any) -> Any:
    """A Typer option; for a config ``field`` its help is the field's description and default,
    so the command line and ``TrainConfig`` cannot drift apart."""
    if field is not None:
        from ftkit.train.config.run import leaves

        info = leaves()[field].info
        default = info.default
        shown = ",".join(default) if isinstance(default, tuple) else default
        help = help or info.description or ""
        if shown not in (None, "") and not isinstance(default, bool):
            help += f" [default: {shown}]"
    return typer.Option(*names, help=help, rich_help_panel=panel, show_default=False, **kw)


def parse_dump_what(text: str) -> tuple[str, ...]:
    """``activations,grads`` -> ``("activations", "grads")``; ``none`` -> ``()``."""
    text = text.strip().lower()
    if text in ("", "none"):
        return ()
    return tuple(p.strip() for p in text.split(",") if p.strip())


def parse_report_to(values: list[str]) -> tuple[str, ...]:
    """``--report-to`` given (repeated, comma-separated) -> the trackers, in order, once each;
    ``none`` names none (``--report-to none`` turns a resumed run's trackers off)."""
    names = (p.strip().lower() for v in values for p in v.split(","))
    return tuple(dict.fromkeys(n for n in names if n and n != "none"))


def given_values(options: dict[str, Any]) -> dict[str, Any]:
    """The config values the command line gave: every option named for a config field
    (``ftkit.train.config.places.CLI_FIELDS``) that was set, as the config takes it (an
    Enum's value, ``--dump-what``'s list parsed, repeated ``--inject`` as a tuple).
    ``--overwrite`` counts only when given (it has no negative form)."""
    from ftkit.train.config.places import CLI_FIELDS

    given: dict[str, Any] = {}
    for name in CLI_FIELDS:
        value = options[name]
        if value is None or (name == "overwrite" and value is False):
            continue
        if isinstance(value, Enum):
            value = value.value
        elif name == "dump_what":
            value = parse_dump_what(value)
        elif name == "report_to":
            value = parse_report_to(value)
        elif isinstance(value, list):
            value = tuple(value)
        given[name] = value
    return given
