"""``--config FILE`` of ``ftkit train``: a JSON or TOML file of config values, read as
untrusted input (a regular file of bounded size; every problem one ``InputError``, exit 2)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ftkit.errors import InputError

MAX_CONFIG_BYTES = 1 << 20


def read_config_file(path: Path) -> dict[str, Any]:
    """The values of a ``--config`` file: TOML when it ends in ``.toml``, JSON otherwise.

    Only a regular file of at most ``MAX_CONFIG_BYTES`` is read (a FIFO or device never
    blocks the command); nesting too deep for the decoder is an error like any other."""
    try:
        if not path.is_file():
            what = "does not exist" if not path.exists() else "is not a regular file"
            raise InputError(
                f"cannot read config file {path}: it {what}", hint="pass an existing JSON or TOML file to --config"
            )
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise InputError(
                f"config file {path} is larger than {MAX_CONFIG_BYTES} bytes", hint="a config holds a few values"
            )
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(
            f"cannot read config file {path}: {exc.strerror or exc}",
            hint="pass an existing JSON or TOML file to --config",
        ) from None
    try:
        if path.suffix.lower() == ".toml":
            if sys.version_info >= (3, 11):
                import tomllib
            else:  # pragma: no cover - Python 3.10 reads TOML with the tomllib backport
                import tomli as tomllib

            values = tomllib.loads(raw.decode("utf-8"))
        else:
            values = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        kind = "TOML" if path.suffix.lower() == ".toml" else "JSON"
        raise InputError(
            f"config file {path} is not valid {kind}: {(str(exc).splitlines() or [type(exc).__name__])[0]}",
            hint="--print-config writes a valid JSON config to start from",
        ) from None
    if not isinstance(values, dict):
        raise InputError(
            f"config file {path} must hold a table/object of config values",
            hint="--print-config writes a valid JSON config to start from",
        )
    return values
