"""The comparator end to end on real dump trees: pairing, modes, TP reassembly, copies, order,
missing evidence, run directories, plain files, and corrupt input (InputError, never a crash)."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from ftkit.dumps.compare import CompareOptions, compare_paths
from ftkit.dumps.rules import load_rules
from ftkit.errors import InputError, UsageError
from ftkit.tensors.sharding import Sharding
from ftkit.tensors.st import write_safetensors_atomic

TOL = CompareOptions("tolerance", rtol=1e-5, atol=1e-8)
EXACT = CompareOptions("exact")


def _codes(result):
    return sorted(f.code for f in result.findings)


def _pair(tmp_path, dump, a_tensors, b_tensors, **kw):
    dump(tmp_path / "a", a_tensors, **kw)
    dump(tmp_path / "b", b_tensors, **kw)
    return tmp_path / "a", tmp_path / "b"


def test_equal_dumps(tmp_path, dump):
    t = [("l0.output", torch.randn(4, 5), 0, 0), ("w.param", torch.randn(3).to(torch.bfloat16))]
    a, b = _pair(tmp_path, dump, t, t)
    for opt in (TOL, EXACT):
        r = compare_paths(a, b, opt)
        assert r.findings == [] and r.first_divergence is None
        assert r.stats["tensors"] == r.stats["equal"] == 2
        assert all(p.metrics.bitwise_equal and p.metrics.max_abs == 0 for p in r.pairs)


def test_within_tolerance_passes_but_exact_fails(tmp_path, dump):
    x = torch.randn(64, 8, dtype=torch.float64).float()
    a, b = _pair(tmp_path, dump, [("h.output", x, 0, 0)], [("h.output", x * (1 + 2e-7), 0, 0)])
    r = compare_paths(a, b, TOL)
    assert r.findings == [] and r.pairs[0].status == "close"
    m = r.pairs[0].metrics
    assert 0 < m.max_rel < 1e-6 and m.bits_differ > 0 and m.tol_fail == 0
    r = compare_paths(a, b, EXACT)
    assert _codes(r) == ["CD001"] and r.pairs[0].status == "differ"
    assert "bits differ" in r.findings[0].message
    r = compare_paths(a, b, CompareOptions("tolerance", rtol=0, atol=0))
    assert _codes(r) == ["CD001"]


def test_bitwise_different_but_numerically_equal_under_exact(tmp_path, dump):
    x = torch.tensor([1.0, 0.0, 2.0])
    y = torch.tensor([1.0, -0.0, 2.0])
    a, b = _pair(tmp_path, dump, [("z.output", x, 0, 0)], [("z.output", y, 0, 0)])
    assert compare_paths(a, b, TOL).findings == []
    r = compare_paths(a, b, EXACT)
    assert _codes(r) == ["CD001"]
    assert r.pairs[0].metrics.argmax == [1] and r.pairs[0].metrics.bits_differ == 1


def test_nan_on_one_side(tmp_path, dump):
    x = torch.randn(10)
    y = x.clone()
    y[3] = float("nan")
    a, b = _pair(tmp_path, dump, [("n.output", x, 0, 0)], [("n.output", y, 0, 0)])
    for opt in (TOL, EXACT):
        r = compare_paths(a, b, opt)
        assert _codes(r) == ["CD001"], opt
        m = r.pairs[0].metrics
        assert (m.nan_a, m.nan_b, m.nonfinite_mismatch, m.argmax) == (0, 1, 1, [3])
        assert "NaN A=0 B=1" in r.findings[0].message


def test_nan_on_both_sides(tmp_path, dump):
    x = torch.randn(10)
    x[2] = float("nan")
    a, b = _pair(tmp_path, dump, [("n.output", x, 0, 0)], [("n.output", x, 0, 0)])
    for opt in (TOL, EXACT):
        r = compare_paths(a, b, opt)
        assert _codes(r) == ["CD010"] and r.findings[0].severity.value == "warning"
        assert r.pairs[0].status == "equal" and r.pairs[0].metrics.nan_a == 1
    # Same position, different NaN payload: numerically NaN == NaN, bitwise not.
    y = x.clone()
    y.view(torch.int32)[2] = 0x7FC00001
    dump(tmp_path / "c", [("n.output", y, 0, 0)])
    assert _codes(compare_paths(a, tmp_path / "c", TOL)) == ["CD010"]
    r = compare_paths(a, tmp_path / "c", EXACT)
    assert "CD001" in _codes(r) and r.pairs[0].metrics.argmax == [2]


def _tp2(root, dump, full_param, full_act, perturb=None):
    """Write TP=2 shards the way megatron holds them: param split on dim 0, activation on the
    last dim with stride 2 (interleaved [gate, up] blocks)."""
    act_shards = [torch.cat(full_act.chunk(4, dim=-1)[r::2], dim=-1) for r in range(2)]
    for r in range(2):
        act = act_shards[r].clone()
        if perturb is not None and r == 1:
            act[perturb] += 0.5
        dump(
            root,
            [
                ("fc1.weight.param", full_param.chunk(2, 0)[r].clone(), 0, None, Sharding.split(0, r, 2)),
                ("fc1.output", act, 0, 0, Sharding.split(2, r, 2, stride=2)),
            ],
            writer=f"step000000-ms000-tp{r}-pp0",
        )


def test_tp2_shards_reassemble_against_tp1(tmp_path, dump):
    param, act = torch.randn(8, 3), torch.randn(2, 3, 8)
    dump(tmp_path / "tp1", [("fc1.weight.param", param, 0, None), ("fc1.output", act, 0, 0)])
    _tp2(tmp_path / "tp2", dump, param, act)
    for a, b in ((tmp_path / "tp1", tmp_path / "tp2"), (tmp_path / "tp2", tmp_path / "tp1")):
        r = compare_paths(a, b, EXACT)
        assert r.findings == [] and r.stats["equal"] == 2
    _tp2(tmp_path / "bad", dump, param, act, perturb=(1, 2, 1))
    r = compare_paths(tmp_path / "tp1", tmp_path / "bad", EXACT)
    assert _codes(r) == ["CD001"]
    # Shard 1 local column 1 is, with stride 2 over 4 blocks of 2, global block 1 -> column 3.
    assert r.pairs[-1].metrics.argmax == [1, 2, 3] and r.pairs[-1].metrics.max_abs == pytest.approx(0.5)


def test_incomplete_or_inconsistent_shards(tmp_path, dump):
    param = torch.randn(8, 3)
    dump(tmp_path / "tp1", [("w.param", param)])
    dump(tmp_path / "half", [("w.param", param[:4], 0, None, Sharding.split(0, 0, 2))], writer="replicated-tp0-pp0")
    r = compare_paths(tmp_path / "tp1", tmp_path / "half", TOL)
    assert _codes(r) == ["CD008"] and r.pairs[0].status == "invalid" and "shards [0] of 2" in r.findings[0].message
    dump(tmp_path / "mixed", [("w.param", param[:4], 0, None, Sharding.split(0, 0, 2))], writer="replicated-tp0-pp0")
    dump(tmp_path / "mixed", [("w.param", param)], writer="replicated-tp1-pp0")
    assert _codes(compare_paths(tmp_path / "tp1", tmp_path / "mixed", TOL)) == ["CD008"]


def test_replica_copies_collapse_or_diverge(tmp_path, dump):
    w = torch.randn(5)
    dump(tmp_path / "one", [("ln.weight.param", w)], writer="replicated-tp0-pp0")
    for c in range(3):  # --dump-cells all: every cell writes the replicated state
        dump(tmp_path / "all", [("ln.weight.param", w)], writer=f"replicated-tp0-pp0-cell{c}", cell=c)
    r = compare_paths(tmp_path / "one", tmp_path / "all", EXACT)
    assert (
        r.findings == []
        and len(r.pairs) == 1
        and r.pairs[0].origins[1]
        == ["replicated-tp0-pp0-cell0", "replicated-tp0-pp0-cell1", "replicated-tp0-pp0-cell2"]
    )
    dump(tmp_path / "all", [("ln.weight.param", w + 1)], writer="replicated-tp0-pp0-cell2", cell=2)
    r = compare_paths(tmp_path / "one", tmp_path / "all", EXACT)
    assert _codes(r) == ["CD007"]
    f = r.findings[0]
    assert f.evidence["side"] == "B" and ["replicated-tp0-pp0-cell2"] in f.evidence["variants"]
    assert r.pairs[0].status == "equal"  # the first copy (cell0) is the one compared


def test_first_divergence_is_the_earliest_in_capture_order(tmp_path, dump):
    """Names sort differently from capture order; steps, micro-shards and stages interleave."""
    names = ["zz_embed.output", "mm_layer.output", "aa_head.output"]

    def run(root, bad: set):
        for step in (0, 1):
            for ms in (0, 1):
                t = [(n, torch.full((3,), 1.0 + ((step, ms, n) in bad)), step, ms) for n in names]
                dump(root, t, writer=f"step{step:06d}-ms{ms:03d}-tp0-pp0")
            grads = [("w.grad", torch.full((2,), 5.0 + ((step, None, "w.grad") in bad)), step)]
            params = [("w.param", torch.ones(2), step)] if step == 0 else []
            dump(root, params + grads, writer=f"replicated-step{step}-tp0-pp0")

    run(tmp_path / "a", set())
    run(
        tmp_path / "b",
        {(1, 0, "zz_embed.output"), (0, 1, "mm_layer.output"), (0, 1, "aa_head.output"), (0, None, "w.grad")},
    )
    r = compare_paths(tmp_path / "a", tmp_path / "b", EXACT)
    failing = [p.id for p in r.pairs if p.failed]
    assert failing == [
        "actor/fwd_bwd/rollout_000000/step000000/ms001:mm_layer.output",
        "actor/fwd_bwd/rollout_000000/step000000/ms001:aa_head.output",
        "actor/fwd_bwd/rollout_000000/step000000:w.grad",
        "actor/fwd_bwd/rollout_000000/step000001/ms000:zz_embed.output",
    ]
    assert r.first_divergence.id == failing[0]
    assert [p.name for p in r.pairs][:4] == ["w.param", "zz_embed.output", "mm_layer.output", "aa_head.output"]


def test_missing_and_extra_tensors_and_rollouts(tmp_path, dump):
    x = torch.ones(2)
    dump(tmp_path / "a", [("a.output", x, 0, 0), ("b.output", x, 0, 0), ("c.output", x, 0, 0)])
    dump(tmp_path / "b", [("a.output", x, 0, 0), ("d.output", x, 0, 0)])
    dump(tmp_path / "a", [("a.output", x, 0, 0)], rollout=1)
    dump(tmp_path / "b", [("a.output", x, 0, 0)], rollout=2, prefix="critic")
    r = compare_paths(tmp_path / "a", tmp_path / "b", TOL)
    assert _codes(r) == ["CD004", "CD004", "CD006", "CD006"]
    msgs = sorted(f.message for f in r.findings)
    assert "actor/fwd_bwd/rollout_000000/step000000/ms000: 2 tensor(s) missing in B: b.output, c.output" in msgs
    assert "actor/fwd_bwd/rollout_000000/step000000/ms000: 1 tensor(s) missing in A: d.output" in msgs
    assert "rollout actor/fwd_bwd/rollout_000001 is missing in B" in msgs
    assert "rollout critic/fwd_bwd/rollout_000002 is missing in A" in msgs
    assert (r.stats["missing_in_a"], r.stats["missing_in_b"], r.stats["missing_rollouts"]) == (1, 2, 2)
    assert r.first_divergence.name == "b.output"


def test_shape_and_dtype_mismatch(tmp_path, dump):
    a, b = _pair(
        tmp_path,
        dump,
        [("s.output", torch.ones(2, 3), 0, 0), ("d.output", torch.ones(4), 0, 0)],
        [("s.output", torch.ones(3, 2), 0, 0), ("d.output", torch.ones(4, dtype=torch.bfloat16), 0, 0)],
    )
    r = compare_paths(a, b, TOL)
    assert _codes(r) == ["CD002", "CD003"]
    assert {p.name: p.status for p in r.pairs} == {"s.output": "shape", "d.output": "dtype"}
    assert r.pairs[1].metrics.max_abs == 0  # values still measured across dtypes


RUN_JSON = json.dumps({"schema": "ftkit.run/1", "config": {"seed": 0}})  # a config: CD014 otherwise


def _run_dir(root, dump, tokens, final=True):
    (root / "events").mkdir(parents=True)
    (root / "run.json").write_text(RUN_JSON)
    (root / "rollouts").mkdir()
    write_safetensors_atomic(root / "rollouts" / "rollout_000000.safetensors", {"tokens": tokens})
    if final:
        (root / "final").mkdir()
        write_safetensors_atomic(root / "final" / "tp0-pp0.safetensors", {"w": torch.ones(3)})
    dump(root / "dumps", [("h.output", torch.ones(2), 0, 0)])


def test_run_directories_compare_dumps_and_every_other_safetensors_file(tmp_path, dump):
    tokens = torch.arange(12).reshape(3, 4)
    _run_dir(tmp_path / "a", dump, tokens)
    _run_dir(tmp_path / "same", dump, tokens)
    r = compare_paths(tmp_path / "a", tmp_path / "same", EXACT)
    assert r.kind == "run" and r.findings == []
    assert [p.id for p in r.pairs] == [
        "actor/fwd_bwd/rollout_000000/step000000/ms000:h.output",
        "final:w",  # final/ files pair by tensor name, whatever the TP/PP rank that wrote them
        "rollouts/rollout_000000.safetensors:tokens",
    ]
    changed = tokens.clone()
    changed[2, 1] = 99
    _run_dir(tmp_path / "b", dump, changed, final=False)
    r = compare_paths(tmp_path / "a", tmp_path / "b", EXACT)
    assert _codes(r) == ["CD001", "CD005"]
    assert r.first_divergence.id == "rollouts/rollout_000000.safetensors:tokens"
    assert r.first_divergence.metrics.argmax == [2, 1]
    assert "file final/tp0-pp0.safetensors is missing in B" in [f.message for f in r.findings]


def _final_run(root, files):
    """A run directory holding only ``final/<file>`` = (tensors, {tensor: Sharding})."""
    (root / "final").mkdir(parents=True)
    (root / "run.json").write_text(RUN_JSON)
    for name, (tensors, split) in files.items():
        meta = {"sharding": json.dumps({k: sh.to_dict() for k, sh in split.items()})} if split else None
        write_safetensors_atomic(root / "final" / name, tensors, metadata=meta)


def test_final_state_pairs_by_tensor_name_across_tp_and_pp_files(tmp_path):
    w, b, ln, step = torch.arange(12.0).reshape(4, 3), torch.arange(4.0), torch.ones(3), torch.tensor(5.0)
    _final_run(tmp_path / "tp1pp1", {"tp0-pp0.safetensors": ({"w": w, "b": b, "ln": ln, "step": step}, {})})
    # TP=2 x PP=2: stage 0 holds w and b split on dim 0 and the replicated step; stage 1 holds ln
    _final_run(
        tmp_path / "tp2pp2",
        {
            f"tp{r}-pp0.safetensors": (
                {"w": w[2 * r : 2 * r + 2], "b": b[2 * r : 2 * r + 2], "step": step},
                {"w": Sharding.split(0, r, 2), "b": Sharding.split(0, r, 2)},
            )
            for r in (0, 1)
        }
        | {f"tp{r}-pp1.safetensors": ({"ln": ln}, {}) for r in (0, 1)},
    )
    r = compare_paths(tmp_path / "tp2pp2", tmp_path / "tp1pp1", EXACT)
    assert r.findings == [] and sorted(p.id for p in r.pairs) == ["final:b", "final:ln", "final:step", "final:w"]
    # a TP shard that differs is found on the assembled tensor, at its full-tensor position
    _final_run(tmp_path / "bad", {"tp0-pp0.safetensors": ({"w": w + (w == 7), "b": b, "ln": ln, "step": step}, {})})
    r = compare_paths(tmp_path / "tp2pp2", tmp_path / "bad", EXACT)
    assert _codes(r) == ["CD001"] and r.first_divergence.id == "final:w" and r.first_divergence.metrics.argmax == [2, 1]


def test_final_state_with_malformed_sharding_metadata_is_unusable(tmp_path):
    _final_run(tmp_path / "a", {"tp0-pp0.safetensors": ({"w": torch.ones(2)}, {})})
    _final_run(tmp_path / "b", {"tp0-pp0.safetensors": ({"w": torch.ones(2)}, {})})
    for bad in ('{"nope": {"kind": "split", "dim": 0}}', '["w"]', '{"w": {"kind": "split", "dim": 1e999}}', "{"):
        write_safetensors_atomic(
            tmp_path / "b" / "final" / "tp0-pp0.safetensors", {"w": torch.ones(2)}, {"sharding": bad}
        )
        with pytest.raises(InputError, match="malformed final state"):
            compare_paths(tmp_path / "a", tmp_path / "b", EXACT)


def test_plain_directories_and_single_files(tmp_path):
    for side, v in (("a", 1.0), ("b", 2.0)):
        (tmp_path / side / "sub").mkdir(parents=True)
        write_safetensors_atomic(
            tmp_path / side / "sub" / "x.safetensors", {"t": torch.ones(2), "u": torch.full((2,), v)}
        )
    r = compare_paths(tmp_path / "a", tmp_path / "b", EXACT)
    assert r.kind == "files" and [p.id for p in r.pairs if p.failed] == ["sub/x.safetensors:u"]
    write_safetensors_atomic(tmp_path / "one.safetensors", {"t": torch.ones(2)})
    write_safetensors_atomic(tmp_path / "two.safetensors", {"t": torch.ones(2), "extra": torch.ones(1)})
    r = compare_paths(tmp_path / "one.safetensors", tmp_path / "two.safetensors", EXACT)
    assert r.kind == "file" and _codes(r) == ["CD004"] and [p.id for p in r.pairs if p.failed] == ["extra"]


def test_orphan_data_file_is_a_warning(tmp_path, dump):
    a, b = _pair(tmp_path, dump, [("h.output", torch.ones(2), 0, 0)], [("h.output", torch.ones(2), 0, 0)])
    rdir = b / "actor" / "fwd_bwd" / "rollout_000000"
    (rdir / "step000000-ms000-tp0-pp0.index.json").rename(tmp_path / "moved.json")
    dump(b, [("h.output", torch.ones(2), 0, 0)], writer="step000000-ms000-tp1-pp0")
    r = compare_paths(a, b, TOL)
    assert _codes(r) == ["CD011"] and r.findings[0].severity.value == "warning"


def test_rules_mode(tmp_path, dump):
    x = torch.randn(50)
    a, b = _pair(
        tmp_path,
        dump,
        [("l.weight.param", x), ("l.output", x, 0, 0), ("l.output_grad", x, 0, 0), ("other", x, 0, 0)],
        [("l.weight.param", x), ("l.output", x * (1 + 1e-4), 0, 0), ("l.output_grad", x + 1, 0, 0), ("other", x, 0, 0)],
    )
    rules = tmp_path / "rules.toml"
    rules.write_text("""
[[rule]]
name = "weights bitwise"
match = '\\.param$'
require = "bitwise_equal"

[[rule]]
name = "activations close"
match = '\\.output(_grad)?$'
require = "max_rel <= 1e-3 and dissimilarity < 1e-6 and nonfinite_mismatch == 0"
""")
    r = compare_paths(a, b, CompareOptions("rules", rules=load_rules(rules)))
    by = {p.name: (p.status, p.rule) for p in r.pairs}
    assert by == {
        "l.weight.param": ("equal", "weights bitwise"),
        "l.output": ("close", "activations close"),
        "l.output_grad": ("differ", "activations close"),
        "other": ("uncovered", None),
    }
    assert _codes(r) == ["CD001", "CD009"]


def _flip_data_byte(path, offset_from_end=1):
    raw = bytearray(path.read_bytes())
    raw[-offset_from_end] ^= 0x01
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    "corruption,needle",
    [
        ("truncate", "truncated"),
        ("lying-offsets", "data_offsets"),
        ("bad-dtype", "unsupported dtype"),
        ("index-json", "not valid JSON"),
        ("index-version", "schema_version 99"),
        ("index-missing-key", "is not in"),
        ("index-dtype", "index says"),
        ("data-bitflip", "does not match the fingerprint"),
        ("data-missing", "data file"),
    ],
)
def test_corrupt_dumps_are_input_errors(tmp_path, dump, corruption, needle):
    a, b = _pair(tmp_path, dump, [("h.output", torch.randn(8), 0, 0)], [("h.output", torch.randn(8), 0, 0)])
    rdir = b / "actor" / "fwd_bwd" / "rollout_000000"
    data, index = rdir / "step000000-ms000-tp0-pp0.safetensors", rdir / "step000000-ms000-tp0-pp0.index.json"
    raw = data.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    key = next(k for k in header if k != "__metadata__")
    doc = json.loads(index.read_text())
    if corruption == "truncate":
        data.write_bytes(raw[:-5])
    elif corruption in ("lying-offsets", "bad-dtype"):
        if corruption == "lying-offsets":
            header[key]["data_offsets"][1] += 4
        else:
            header[key]["dtype"] = "Q9"
        h = json.dumps(header).encode()
        data.write_bytes(struct.pack("<Q", len(h)) + h + raw[8 + n :])
    elif corruption == "index-json":
        index.write_text("{not json")
    elif corruption == "index-version":
        doc["schema_version"] = 99
        index.write_text(json.dumps(doc))
    elif corruption == "index-missing-key":
        doc["tensors"][0]["key"] = "nope"
        index.write_text(json.dumps(doc))
    elif corruption == "index-dtype":
        doc["tensors"][0]["dtype"] = "float16"
        index.write_text(json.dumps(doc))
    elif corruption == "data-bitflip":
        _flip_data_byte(data)
    elif corruption == "data-missing":
        data.unlink()
    with pytest.raises(InputError) as err:
        compare_paths(a, b, TOL)
    assert needle in err.value.message and err.value.hint


def test_incompatible_or_empty_inputs(tmp_path, dump):
    dump(tmp_path / "d", [("h.output", torch.ones(2), 0, 0)])
    (tmp_path / "f").mkdir()
    write_safetensors_atomic(tmp_path / "f" / "x.safetensors", {"t": torch.ones(2)})
    with pytest.raises(UsageError, match="cannot compare a dump directory"):
        compare_paths(tmp_path / "d", tmp_path / "f", TOL)
    (tmp_path / "e1").mkdir()
    (tmp_path / "e2").mkdir()
    with pytest.raises(InputError, match="nothing to compare"):
        compare_paths(tmp_path / "e1", tmp_path / "e2", TOL)
    with pytest.raises(InputError, match="does not exist"):
        compare_paths(tmp_path / "nope", tmp_path / "e2", TOL)
    r = compare_paths(tmp_path / "f", tmp_path / "e2", TOL)  # one side empty: everything is missing
    assert _codes(r) == ["CD005"]


def test_a_one_ulp_bf16_change_is_found_exactly_and_outside_the_default_tolerance(tmp_path, dump):
    """bf16 dumps (issue 37): one ulp of bf16 is 2^-8 relative at most (2^-7 at 1.0), far above the
    default rtol 1e-5 (docs/dumps.md, "bf16"), so both --exact and the default tolerance find it;
    a tolerance of one bf16 ulp accepts it."""
    base = torch.tensor([1.0, -0.5, 3.0, 0.25], dtype=torch.bfloat16)
    bumped = base.clone()
    bumped.view(torch.int16)[2] += 1  # 3.0 -> its bf16 successor
    a, b = _pair(tmp_path, dump, [("w.param", bumped)], [("w.param", base)])
    for opt in (EXACT, TOL):
        r = compare_paths(a, b, opt)
        assert [p.metrics.bitwise_equal for p in r.pairs] == [False] and r.findings, opt
    ulp = CompareOptions("tolerance", rtol=2.0**-7, atol=0.0)
    assert compare_paths(a, b, ulp).findings == []
