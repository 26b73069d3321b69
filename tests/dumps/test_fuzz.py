"""Randomised suite: mutated safetensors files and dump trees never crash, hang or signal.

Bounded and seeded: ``FTKIT_FUZZ_CASES`` cases (default 500, 2,000 in the full suite:
``tests/suite.py``) of one to three mutations each
(``tests/dumps/fuzzing.py``), run in-process through the CLI's ``main`` with a per-case alarm,
plus a few as subprocesses of ``python -m ftkit`` (which would show a signal as a negative
return code). Every case must exit 0, 1 or 2; exit 2 must print an ``Error:`` line and a
``Hint:``; JSON output must parse. ``FTKIT_FUZZ_SEED`` changes the seed.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fuzzing import mutate_tree  # tests/dumps/fuzzing.py (pytest puts this directory on sys.path)
from suite import FULL

from ftkit import cli
from ftkit.dumps.writer import DumpWriter
from ftkit.tensors.sharding import Sharding
from ftkit.tensors.st import write_safetensors_atomic

CASES = int(os.environ.get("FTKIT_FUZZ_CASES", "2000" if FULL else "500"))
SEED = int(os.environ.get("FTKIT_FUZZ_SEED", "20261130"))
CASE_TIMEOUT_S = 30
SUBPROCESS_CASES = 6


class Hang(Exception):
    pass


def _base_dump(root: Path) -> None:
    g = torch.Generator().manual_seed(0)
    values = {
        "l0.output": torch.randn(4, 6, generator=g),
        "l0.output_grad": torch.randn(4, 6, generator=g).to(torch.bfloat16),
        "l1.output": torch.randn(3, generator=g).to(torch.float16),
        "tok.input.0": torch.arange(6),
        "mask.output": torch.tensor([True, False, True]),
        "f8.output": torch.randn(5, generator=g).to(torch.float8_e4m3fn),
        "nan.output": torch.tensor([1.0, float("nan"), float("inf")]),
    }
    for tp in range(2):
        dw = DumpWriter(root, "actor", "fwd_bwd", 0, f"step000000-ms000-tp{tp}-pp0", meta={"cell": 0, "rank": tp})
        for name, t in values.items():
            dw.add(name, t, step=0, micro_shard=0, sharding=Sharding.replicated(tp, 2))
        full = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
        dw.add("w.weight.param", full.chunk(2, 1)[tp].clone(), step=0, sharding=Sharding.split(1, tp, 2))
        dw.write()
    dw = DumpWriter(root, "actor", "fwd_bwd", 1, "replicated-tp0-pp0", meta={"cell": 0, "rank": 0})
    dw.add("w.weight.grad", torch.randn(4, 8, generator=g), step=1)
    dw.write()


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fuzz-base")
    _base_dump(root / "dumps")
    files = root / "files"
    (files / "sub").mkdir(parents=True)
    g = torch.Generator().manual_seed(2)
    write_safetensors_atomic(files / "x.safetensors", {"a": torch.randn(3, 3, generator=g)})
    write_safetensors_atomic(
        files / "sub" / "y.safetensors",
        {"b": torch.randn(7, generator=g).to(torch.bfloat16), "c": torch.arange(4)},
        metadata={"k": "v"},
    )
    rules = root / "rules.toml"
    rules.write_text(
        "[[rule]]\nmatch = 'param$'\nrequire = 'bitwise_equal'\n[[rule]]\nmatch = '.'\nrequire = 'max_rel < 1'\n"
    )
    return {"dumps": root / "dumps", "files": root / "files", "rules": rules}


def _argv(rng: random.Random, a: Path, b: Path, rules: Path) -> list[str]:
    if rng.random() < 0.3:
        return ["dump", str(a), *rng.choice([[], ["--format", "json"], ["--no-stats"], ["--filter", "out"]])]
    opts = rng.choice([[], ["--exact"], ["--rtol", "1e-3"], ["--format", "json"], ["--format", "github"]])
    opts += rng.choice([[], [], ["--rules", str(rules)], ["--fail-on", "warning"]]) if "--exact" not in opts else []
    if "--rules" in opts and "--rtol" in opts:
        opts = opts[2:]
    first, second = (a, b) if rng.random() < 0.7 else (b, a)
    return ["compare-dumps", str(first), str(second), *opts]


def _on_alarm(signum: int, frame: object) -> None:
    raise Hang()


def _check(argv: list[str], code: int, out: str, err: str) -> str | None:
    """What is wrong with one result, or None."""
    if code not in (0, 1, 2):
        return f"exit {code}: {err.strip().splitlines()[-3:]}"
    if "Traceback" in err:
        return "traceback on stderr"
    if code == 2:
        lines = err.strip().splitlines()
        if len(lines) < 2 or not lines[-2].startswith("Error: ") or not lines[-1].startswith("Hint: "):
            return f"exit 2 without Error/Hint: {lines[-2:]}"
        if out:
            return "exit 2 wrote to stdout"
    elif "json" in argv:
        try:
            json.loads(out)
        except ValueError:
            return "stdout is not JSON"
    return None


@pytest.mark.parametrize("kind", ["dumps", "files"])
def test_mutated_trees_in_process(bases, tmp_path, capsys, kind):
    n = CASES * (3 if kind == "dumps" else 1) // 4  # three quarters dump trees, a quarter plain files
    rng = random.Random(f"{SEED}-{kind}")
    failures, codes = [], {0: 0, 1: 0, 2: 0}
    old = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        for case in range(n):
            work = tmp_path / f"c{case}"
            a = work / "a"
            shutil.copytree(bases[kind], a, symlinks=True)
            what = mutate_tree(a, rng)
            argv = _argv(rng, a, bases[kind], bases["rules"])
            signal.setitimer(signal.ITIMER_REAL, CASE_TIMEOUT_S)
            try:
                code = cli.main(argv)
            except Hang:
                code = -1
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            out, err = capsys.readouterr()
            problem = "hang" if code == -1 else _check(argv, code, out, err)
            if problem:
                failures.append((case, what, argv[:1] + argv[3:], problem))
            else:
                codes[code] += 1
            shutil.rmtree(work, ignore_errors=True)
    finally:
        signal.signal(signal.SIGALRM, old)
    assert not failures, failures[:10]
    assert codes[2] > n // 4 and codes[0] + codes[1] > 0, codes  # the mutations do reach the checks


def test_mutated_trees_as_subprocesses(bases, tmp_path):
    rng = random.Random(f"{SEED}-subprocess")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(cli.__file__).parents[1]), *sys.path])}
    for case in range(SUBPROCESS_CASES):
        a = tmp_path / f"c{case}" / "a"
        shutil.copytree(bases["dumps"], a, symlinks=True)
        what = mutate_tree(a, rng)
        argv = _argv(rng, a, bases["dumps"], bases["rules"])
        proc = subprocess.run(
            [sys.executable, "-m", "ftkit", *argv], capture_output=True, text=True, timeout=120, env=env
        )
        assert proc.returncode in (0, 1, 2), (what, proc.returncode, proc.stderr[-500:])  # < 0: a signal
        assert _check(argv, proc.returncode, proc.stdout, proc.stderr) is None, (what, proc.stderr[-500:])
