"""Equivalence check of two ftkit trees' ``analyze-events`` (a speed change must not change a byte).

``make DIR`` writes the inputs once: per-process logs with each rule's violation injected
(``ftkit.testing.synthetic``), a faulted run, and ``--fuzz N`` mutated logs from the fuzz suite's
mutator (``tests/analysis/test_fuzz_events.py``: byte flips, cut lines, wrong types, deep nesting,
shuffles, splits, gzip). ``run DIR OUT`` analyses every input with the ftkit importable from
``PYTHONPATH`` and writes one line per input: its exit code and the CLI's ``--format json``
output. Run it under both trees and compare the two OUT files byte for byte::

    PYTHONPATH=$PWD python bench/analyze_equivalence.py make /tmp/eq --fuzz 300
    PYTHONPATH=/old/tree python bench/analyze_equivalence.py run /tmp/eq /tmp/old.out
    PYTHONPATH=$PWD python bench/analyze_equivalence.py run /tmp/eq /tmp/new.out
    cmp /tmp/old.out /tmp/new.out
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import sys
from pathlib import Path


def make(root: Path, fuzz: int, seed: int) -> None:
    from ftkit.testing.synthetic import generate
    from ftkit.testing.synthetic_spec import VIOLATIONS, SyntheticSpec

    cases: list[list[str]] = []
    specs = [("clean", SyntheticSpec(cells=3, tp=2, pp=2, rollouts=4, tensors=20, faults=2))]
    specs += [(v, SyntheticSpec(cells=3, tp=1, pp=2, rollouts=3, tensors=6, faults=1, violation=v)) for v in VIOLATIONS]
    for name, spec in specs:
        generate(root / name, spec)
        cases.append([str(root / name / "events")])
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "analysis"))
    import test_fuzz_events as fz  # the fuzz suite's mutator and writer

    bases = []
    for i, spec in enumerate(
        (
            SyntheticSpec(
                cells=2, engines=1, rollouts=2, steps_per_rollout=2, samples_per_rollout=8, tensors=4, faults=0
            ),
            SyntheticSpec(
                cells=3, engines=1, rollouts=2, steps_per_rollout=2, samples_per_rollout=8, tensors=4, faults=1
            ),
        )
    ):
        generate(root / f"base{i}", spec)
        bases.append(fz._load(root / f"base{i}" / "events"))
    rng = random.Random(seed)
    for k in range(fuzz):
        case = fz.mutate(bases[k % 2], rng)
        cases.append(fz.write_case(case, root / f"fuzz{k}", rng))
    (root / "cases.json").write_text(json.dumps(cases))


def run(root: Path, out: Path) -> None:
    from ftkit import cli

    cases = json.loads((root / "cases.json").read_text())
    with open(out, "w") as fh:
        for paths in cases:
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
                code = cli.main(["analyze-events", *paths, "--format", "json"])
            fh.write(json.dumps({"case": [Path(p).relative_to(root).as_posix() for p in paths], "exit": code}))
            fh.write("\n" + buf.getvalue().replace(str(root), "ROOT") + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir", type=Path)
    m.add_argument("--fuzz", type=int, default=200)
    m.add_argument("--seed", type=int, default=20261202)
    r = sub.add_parser("run")
    r.add_argument("dir", type=Path)
    r.add_argument("out", type=Path)
    args = p.parse_args()
    if args.cmd == "make":
        make(args.dir, args.fuzz, args.seed)
    else:
        run(args.dir, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
