"""The training core's shape holds (the package-wide rules, no import circle and the lower
layers never importing ``ftkit.train``, are ``tests/test_layers.py``): every
sub-package says what it holds, and fewer than 8% of the parameters of ``train/`` functions
are annotated with ``Any`` (``scripts/any_params.py``)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "ftkit" / "train"


def test_every_sub_package_says_what_it_holds() -> None:
    for init in TRAIN.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc) > 120, f"{init.relative_to(ROOT)} needs a one-paragraph docstring"
    assert not [p.name for p in TRAIN.glob("*.py") if p.name != "__init__.py"]  # every module in a sub-package


def test_any_annotated_parameters_stay_below_8_percent() -> None:
    spec = importlib.util.spec_from_file_location("any_params", ROOT / "scripts" / "any_params.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["any_params"] = module
    spec.loader.exec_module(module)
    counts = module.count(TRAIN)
    any_n, total = sum(a for a, _ in counts.values()), sum(t for _, t in counts.values())
    assert total > 500 and any_n / total < 0.08, f"{any_n} of {total} parameters are annotated with Any"
