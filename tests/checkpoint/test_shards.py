"""Payload groups stored as shard files (``ftkit.checkpoint.shards``): the naming and packing
rule, a state bigger than the shard size published as N files that verify and load back bitwise,
and FT218 for every way a group's shard set can be broken (with the manifest relisted to match,
as a lying writer would, so only the shard rule can tell)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ftkit.checkpoint import manifest as mf
from ftkit.checkpoint.guard import GuardVerdict
from ftkit.checkpoint.layout import EXTRA, MODEL, OPTIMIZER
from ftkit.checkpoint.preflight import agree, preflight
from ftkit.checkpoint.publish import Publisher
from ftkit.checkpoint.restore import load, read_groups, state_payload
from ftkit.checkpoint.retention import RetentionPolicy
from ftkit.checkpoint.shards import group_of, group_problems, groups, merge, parse, shard_name, split
from ftkit.checkpoint.stfile import FileRecord, digest_st, write_st
from ftkit.checkpoint.verify import verify_path
from ftkit.errors import InputError

SHARD = 4096  # bytes of tensor data per shard file in these tests


def test_naming_rule_and_packing() -> None:
    assert shard_name("optimizer.safetensors", 2, 3) == "optimizer-00002-of-00003.safetensors"
    assert shard_name("optimizer.safetensors", 1, 1) == "optimizer.safetensors"
    assert parse("optimizer-00002-of-00003.safetensors") == ("optimizer.safetensors", 2, 3)
    assert parse("optimizer.safetensors") is None and parse("x-1-of-3.safetensors") is None
    assert group_of("model-00001-of-00002.safetensors") == "model.safetensors"
    assert list(split("m.safetensors", {"x": 1}, {"x": 8}, 64)) == ["m.safetensors"]
    assert merge({"opt-00002-of-00002.safetensors": {"b": 2}, "opt-00001-of-00002.safetensors": {"a": 1}}) == {
        "opt.safetensors": {"a": 1, "b": 2}
    }


def test_packing_whole_tensors_in_name_order() -> None:
    """c (100 > 64 bytes) gets a shard of its own; the same input always gives the same files."""
    sizes = {"a": 30, "b": 30, "c": 100, "d": 10, "e": 50}
    parts = split("opt.safetensors", dict.fromkeys(sizes, "t"), sizes, 64)
    assert [sorted(p) for p in parts.values()] == [["a", "b"], ["c"], ["d", "e"]]
    assert list(parts) == [f"opt-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]


@pytest.mark.parametrize(
    ("listed", "why"),
    [
        ({"o-00001-of-00003.safetensors": ["a"], "o-00003-of-00003.safetensors": ["c"]}, "2 of 3"),
        ({"o-00001-of-00002.safetensors": ["a"], "o-00002-of-00003.safetensors": ["b"]}, "shard count"),
        (
            {
                "o-00001-of-00002.safetensors": ["a"],
                "o-00002-of-00002.safetensors": ["b"],
                "o-00003-of-00002.safetensors": ["c"],
            },
            "outside 1..2",
        ),  # fmt: skip
        ({"o.safetensors": ["a"], "o-00001-of-00002.safetensors": ["b"], "o-00002-of-00002.safetensors": []}, "next"),
        ({"o-00001-of-00001.safetensors": ["a"]}, "1 shard of 1"),
        ({"o-00001-of-00002.safetensors": ["a", "b"], "o-00002-of-00002.safetensors": ["b"]}, "in both"),
    ],
)
def test_group_problems(listed, why) -> None:
    problems = group_problems(listed)
    assert problems and any(why in p for _, p in problems), problems


def test_whole_groups_have_no_problems() -> None:
    assert group_problems({"model.safetensors": ["a"], "o-00001-of-00002.safetensors": ["a"],
                           "o-00002-of-00002.safetensors": ["b"]}) == []  # fmt: skip


def _state(seed: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A model of ~20 KiB of parameters (bigger than SHARD) and its Adam state."""
    g = torch.Generator().manual_seed(seed)
    params = {f"layers.{i}.weight": torch.randn(16, 24, generator=g) for i in range(6)}
    params["embedding.weight"] = torch.randn(64, 40, generator=g).to(torch.bfloat16)  # 5 KiB: a shard alone
    optim = {
        f"{n}.{k}": torch.randn(t.shape, generator=g) for n, t in params.items() for k in ("exp_avg", "exp_avg_sq")
    }
    optim.update({f"{n}.step": torch.tensor(3.0) for n in params})
    return params, optim, {"counters": torch.tensor([7, 1]), "rng": torch.arange(16, dtype=torch.uint8)}


@pytest.fixture
def sharded(tmp_path: Path) -> tuple[Path, tuple]:
    from ftkit.tensors.fingerprint import combine, fingerprint

    state = _state(1)
    params, optim, extra = state
    total = combine({**{f"param/{n}": fingerprint(t) for n, t in params.items()},
                     **{f"optimizer/{n}": fingerprint(t) for n, t in optim.items()}})  # fmt: skip
    pub = Publisher(tmp_path / "checkpoints", RetentionPolicy(keep_last=2), shard_bytes=SHARD)
    p = state_payload(params, optim, extra, {"layout": {"tp": 1, "pp": 1}}, {"0": total})
    gv = GuardVerdict(4, 7, False)
    out = pub.publish(7, p, gv, agree([preflight(pub.dir, 7, p.nbytes, gv, "r0")]), metric=0.5, rollout=1)
    assert out.published, out.reason
    return out.path, state


def test_a_state_bigger_than_the_shard_size_publishes_n_files_that_verify_and_load_bitwise(sharded) -> None:
    path, (params, optim, extra) = sharded
    by_group = groups(p.name for p in path.iterdir())
    assert len(by_group[MODEL]) == 4 and len(by_group[OPTIMIZER]) == 8 and by_group[EXTRA] == [EXTRA]
    man, _ = mf.load(path / "MANIFEST.json")
    for f in by_group[MODEL] + by_group[OPTIMIZER]:
        entry = man.files[f]
        assert entry.size == (path / f).stat().st_size and entry.tensors
        assert entry.sha256 == hashlib.sha256((path / f).read_bytes()).hexdigest()
        assert entry.size <= SHARD + 1024 or len(entry.tensors) == 1  # bounded, or one tensor alone
        assert man.fingerprint_prefixes[f] == ("param/" if f.startswith("model") else "optimizer/")
    res = verify_path(path)
    assert res.findings == [] and len(res.rows) == 4 + 8 + 2
    assert {r.code: r.checked for r in res.rules}["FT218"] == 3
    files, meta = load(path)
    assert sorted(files) == [EXTRA, MODEL, OPTIMIZER] and meta["step"] == 7
    for group, want in ((MODEL, params), (OPTIMIZER, optim), (EXTRA, extra)):
        assert sorted(files[group]) == sorted(want)
        for n, t in want.items():
            assert files[group][n].dtype == t.dtype and torch.equal(files[group][n], t)


def _relist(d: Path, prefixes: dict[str, str] | None = None) -> None:
    """Rewrite the manifest over the safetensors files now on disk, consistent in every other way
    (sizes, hashes, tensors, state fingerprint), as a lying writer would."""
    man, _ = mf.load(d / "MANIFEST.json")
    records = {
        "meta.json": FileRecord(**{k: v for k, v in man.files["meta.json"].model_dump().items() if k != "tensors"})
    }
    for p in sorted(d.glob("*.safetensors")):
        rec = digest_st(p)
        records[p.name] = FileRecord(rec.size, rec.sha256, rec.tensors)
    if prefixes is None:
        prefixes = {f: ("param/" if f.startswith("model") else "optimizer/") for f in records
                    if f.startswith(("model", "optimizer"))}  # fmt: skip
    new = mf.build(step=man.step, rollout=man.rollout, created=man.created, records=records,
                   guard=man.guard.model_dump(), metric_name=man.metric.name, metric=man.metric.value,
                   prefixes=prefixes, rank_totals={})  # fmt: skip
    (d / "MANIFEST.json").write_bytes(mf.dumps(new))


def _opt(i: int, n: int = 8) -> str:
    return f"optimizer-{i:05d}-of-{n:05d}.safetensors"


def _tamper(path: Path, how: str) -> None:
    if how == "missing":  # a shard deleted, and the manifest relisted without it
        (path / _opt(5)).unlink()
    elif how == "extra":  # a ninth shard of eight
        shutil.copy(path / _opt(8), path / _opt(9))
    elif how == "count":  # one shard renamed into another set (its index duplicated across counts)
        (path / _opt(8)).rename(path / _opt(8, 9))
    elif how == "plain":  # a plain file next to the shards
        shutil.copy(path / _opt(1), path / OPTIMIZER)
    elif how == "duplicate":  # a tensor of shard 1 copied into shard 2
        from safetensors.torch import load_file

        one, two = ({n: t.clone() for n, t in load_file(str(path / _opt(i))).items()} for i in (1, 2))  # unmapped
        name = sorted(one)[0]
        write_st(path / _opt(2), {**two, name: one[name]})
    if how == "prefix":  # one shard of the optimizer no longer counted in the state fingerprint
        prefixes = {f: ("param/" if f.startswith("model") else "optimizer/") for f in groups(
            p.name for p in path.iterdir())[MODEL] + groups(p.name for p in path.iterdir())[OPTIMIZER]}  # fmt: skip
        del prefixes[_opt(3)]
        _relist(path, prefixes)
    else:
        _relist(path)


@pytest.mark.parametrize("how", ["missing", "extra", "count", "plain", "duplicate", "prefix"])
def test_ft218_a_broken_shard_set_fails_closed(sharded, how) -> None:
    path, _ = sharded
    _tamper(path, how)
    found = verify_path(path).findings
    assert {f.code for f in found} == {"FT218"}, [(f.code, f.message) for f in found]
    with pytest.raises(InputError, match="FT218"):
        load(path)
    if how != "prefix":  # even a reader told the checkpoint was verified reads no broken group
        with pytest.raises(InputError, match="FT218"):
            read_groups(path)


def test_a_shard_missing_from_disk_or_unlisted_is_caught_without_relisting(sharded) -> None:
    path, _ = sharded
    (path / _opt(4)).unlink()
    assert [f.code for f in verify_path(path).findings] == ["FT206"]
    shutil.copy(path / _opt(3), path / _opt(4))
    shutil.copy(path / _opt(3), path / _opt(9))
    codes = {f.code for f in verify_path(path).findings}
    assert codes == {"FT203", "FT205", "FT208"}, codes  # shard 4's bytes are shard 3's; shard 9 is unlisted
    assert json.loads((path / "MANIFEST.json").read_text())["files"][_opt(4)]


def test_payload_names_may_not_look_like_shards(tmp_path) -> None:
    from ftkit.checkpoint.publish import Payload

    pub = Publisher(tmp_path / "checkpoints", RetentionPolicy())
    p = Payload(files={"model-00001-of-00002.safetensors": {"a": torch.zeros(2)}})
    gv = GuardVerdict(0, 3, False)
    with pytest.raises(ValueError, match="shard"):
        pub.publish(3, p, gv, agree([preflight(pub.dir, 3, p.nbytes, gv, "r0")]))


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.dictionaries(st.text("abcdefgh.", min_size=1, max_size=6), st.integers(0, 300), max_size=30),
    limit=st.integers(1, 256),
)
def test_split_then_merge_is_the_identity_and_follows_the_rule(sizes, limit) -> None:
    parts = split("g.safetensors", {n: n for n in sizes}, sizes, limit)
    assert merge(parts) == ({"g.safetensors": {n: n for n in sizes}})
    assert group_problems({f: list(p) for f, p in parts.items()}) == []
    for p in parts.values():  # bounded, or one tensor alone
        assert sum(sizes[n] for n in p) <= limit or len(p) == 1
    names = [n for p in parts.values() for n in p]
    assert names == sorted(sizes)  # whole tensors, name order, each once
