"""Generate ftkit's shipped dataset of arithmetic word problems with exact answers.

    python scripts/make_arithmetic_dataset.py            # rewrites ftkit/tasks/data/arithmetic.jsonl
    python scripts/make_arithmetic_dataset.py --out x.jsonl --count 100 --seed 1

Each line is ``{"prompt": ..., "answer": ...}``: a one- or two-step word problem (addition,
subtraction, multiplication, exact division, a purchase with change, a two-step stock count)
and its answer as the decimal text of a non-negative integer. The prompt asks for the final
answer in ``\\boxed{}``, which ``exact_match`` reads. The output is a function of ``--seed`` and
``--count`` alone: every draw is ``blake2b(seed, problem, field)`` (no ``random`` module, whose
streams may change between Python versions), so regenerating gives the same bytes on any
machine (``tests/tasks/test_arithmetic_dataset.py`` checks that the shipped file is exactly
what this script writes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "ftkit" / "tasks" / "data" / "arithmetic.jsonl"
SUFFIX = " Put the final answer in \\boxed{}."
NAMES = [
    "Ava", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ines", "Jamal", "Kofi", "Lena", "Mateo", "Noor",
]  # fmt: skip
ITEMS = ["apples", "marbles", "stickers", "books", "pencils", "shells", "cards", "coins", "stamps", "beads"]
GOODS = ["notebook", "sandwich", "ticket", "toy car", "plant", "lamp", "scarf", "mug"]


class Draw:
    """Deterministic integer draws for one problem: ``blake2b(seed/index/field)``."""

    def __init__(self, seed: int, index: int) -> None:
        self.prefix = f"{seed}/{index}/"

    def int(self, field: str, low: int, high: int) -> int:
        """An integer in ``[low, high]``."""
        digest = hashlib.blake2b((self.prefix + field).encode(), digest_size=8).digest()
        return low + int.from_bytes(digest, "little") % (high - low + 1)

    def pick(self, field: str, options: list[str]) -> str:
        return options[self.int(field, 0, len(options) - 1)]


def problem(d: Draw) -> tuple[str, int]:
    """One word problem and its answer."""
    name, item = d.pick("name", NAMES), d.pick("item", ITEMS)
    kind = d.int("kind", 0, 5)
    if kind == 0:
        a, b = d.int("a", 2, 500), d.int("b", 2, 500)
        return f"{name} has {a} {item} and finds {b} more. How many {item} does {name} have now?", a + b
    if kind == 1:
        a = d.int("a", 10, 900)
        b = d.int("b", 1, a - 1)
        return f"{name} had {a} {item} and gave {b} of them away. How many {item} are left?", a - b
    if kind == 2:
        a, b = d.int("a", 2, 60), d.int("b", 2, 40)
        return f"A box holds {a} {item}. How many {item} are in {b} full boxes?", a * b
    if kind == 3:
        each, people = d.int("a", 2, 50), d.int("b", 2, 12)
        return (
            f"{name} shares {each * people} {item} equally among {people} friends. How many {item} does each get?",
            each,
        )
    if kind == 4:
        price, count = d.int("a", 2, 40), d.int("b", 2, 9)
        paid = (price * count // 10 + 1 + d.int("c", 0, 5)) * 10
        good = d.pick("good", GOODS)
        return (
            f"A {good} costs {price} dollars. {name} buys {count} of them and pays with {paid} dollars. "
            f"How many dollars of change does {name} get?",
            paid - price * count,
        )
    start, packs, size = d.int("a", 5, 200), d.int("b", 2, 9), d.int("c", 2, 12)
    gone = d.int("d", 1, start + packs * size - 1)
    return (
        f"{name} has {start} {item}, buys {packs} packs of {size} {item} each, then gives away {gone}. "
        f"How many {item} does {name} have left?",
        start + packs * size - gone,
    )


def render(seed: int, count: int) -> bytes:
    """The dataset's bytes: ``count`` JSON lines."""
    lines = []
    for i in range(count):
        text, answer = problem(Draw(seed, i))
        lines.append(json.dumps({"prompt": text + SUFFIX, "answer": str(answer)}, ensure_ascii=True) + "\n")
    return "".join(lines).encode("ascii")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--count", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.write_bytes(render(args.seed, args.count))


if __name__ == "__main__":
    main()
