"""``ftkit train`` refuses bad configuration with exit 2 before anything starts: non-finite
numbers, loosely typed config files, configs nested too deep, config paths that are not
regular files."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from ftkit.cli import main


def _train(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["train", "--print-config", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1 and "Hint: " in err and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "NaN", "Infinity"])
def test_lr_must_be_finite(capsys: pytest.CaptureFixture[str], value: str) -> None:
    code, out, err = _train(capsys, "--lr", value)
    assert code == 2 and out == "" and "lr: expected a finite number" in _error(err)


@pytest.mark.parametrize(
    "text, field",
    [
        ('{"cells": true}', "cells"),
        ('{"cells": "2"}', "cells"),
        ('{"lr": 1e999}', "lr"),
        ('{"overwrite": "yes"}', "overwrite"),
        ('{"dump_what": "grads"}', "dump_what"),
    ],
)
def test_config_file_values_are_strict(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, field: str
) -> None:
    path = tmp_path / "c.json"
    path.write_text(text)
    code, out, err = _train(capsys, "--config", str(path))
    assert code == 2 and out == "" and f"{field}: expected" in _error(err)


def test_toml_config_values_are_strict(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("cells = true\nlr = inf\n")
    code, _, err = _train(capsys, "--config", str(path))
    assert code == 2 and "cells: expected an integer" in _error(err)


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_config_nested_100000_deep(capsys: pytest.CaptureFixture[str], tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"deep{suffix}"
    depth = 100_000
    if suffix == ".json":
        path.write_text('{"cells": ' + "[" * depth + "]" * depth + "}")
    else:
        path.write_text("cells = " + "[" * depth + "]" * depth + "\n")
    code, out, err = _train(capsys, "--config", str(path))
    assert code == 2 and out == "" and "is not valid" in _error(err)


def test_config_that_is_a_fifo_does_not_hang(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    result: list[tuple[int, str, str]] = []
    worker = threading.Thread(target=lambda: result.append(_train(capsys, "--config", str(fifo))), daemon=True)
    worker.start()
    worker.join(60)
    if worker.is_alive():  # unblock the reader so the test process can end, then fail
        with open(fifo, "w") as fh:
            fh.write("{}")
        pytest.fail("--config FIFO blocked")
    code, out, err = result[0]
    assert code == 2 and out == "" and "is not a regular file" in _error(err)


def test_config_that_is_a_device_or_missing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = _train(capsys, "--config", "/dev/zero")
    assert code == 2 and "is not a regular file" in _error(err)
    code, _, err = _train(capsys, "--config", str(tmp_path / "nope.json"))
    assert code == 2 and "does not exist" in _error(err)


def test_error_lines_show_no_control_text_from_inputs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    name = tmp_path / "a\x1b[2J\nError: forged.json"
    code, out, err = _train(capsys, "--config", str(name))
    assert code == 2 and out == "" and "\x1b" not in err
    assert [line for line in err.splitlines() if line.startswith("Error: ")] == [_error(err)]
    assert "\\x1b[2J" in _error(err)


def test_train_junit_path_in_a_missing_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["train", "--out", str(tmp_path / "run"), "--junit-xml", str(tmp_path / "no" / "r.xml")])
    err = capsys.readouterr().err
    assert code == 2 and "cannot write" in _error(err) and not (tmp_path / "run").exists()
