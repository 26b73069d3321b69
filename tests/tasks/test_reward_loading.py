"""Reward loading (built-in, module:function, entry point), the signature check, scoring errors
and the determinism checks."""

import math
import sys

import pytest

from ftkit.errors import ConfigError
from ftkit.tasks.protocols import RewardSample
from ftkit.tasks.rewards import (
    ENTRY_POINT_GROUP,
    LoadedReward,
    RewardError,
    check_determinism,
    compare_rewards,
    determinism_subset,
    load_reward,
    score,
)


def _samples(n=5):
    return [RewardSample(f"p{i}", f"answer {i}", str(i), [1, i], [i, 2]) for i in range(n)]


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """A directory on sys.path to write plug-in modules into (names unique per test)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("rw_")]:
        del sys.modules[name]


def _module(plugin_dir, name, source):
    (plugin_dir / f"{name}.py").write_text(source)
    return name


def test_builtins_load_by_name():
    for name in ("exact_match", "format", "task", "deterministic_random"):
        assert load_reward(name).name == name


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("def r(prompt, response):\n    return 0.0\n", "got an unexpected keyword argument 'label'"),
        ("def r(*, prompt, response, label, prompt_ids, response_ids, extra):\n    return 0.0\n", "missing a required"),
        ("def r(x, **kwargs):\n    return 0.0\n", "missing a required argument: 'x'"),
        ("r = 3\n", "is a int, not a function"),
    ],
)
def test_a_function_that_cannot_take_the_contract_is_a_config_error_with_the_reason(plugin_dir, source, reason):
    mod = _module(plugin_dir, f"rw_sig{abs(hash(source)) % 10**8}", source)
    with pytest.raises(ConfigError) as e:
        load_reward(f"{mod}:r")
    assert e.value.exit_code == 2 and reason in e.value.message


def test_positional_or_keyword_parameters_and_kwargs_are_accepted(plugin_dir):
    mod = _module(plugin_dir, "rw_ok", "def a(prompt, response, label, prompt_ids, response_ids):\n    return 1\n"
                  "def b(response, **kwargs):\n    return 0.5\n")  # fmt: skip
    assert score(load_reward(f"{mod}:a"), _samples(2)) == [1.0, 1.0]
    assert score(load_reward(f"{mod}:b"), _samples(2)) == [0.5, 0.5]


def test_unresolvable_specs_are_config_errors():
    with pytest.raises(ConfigError, match="cannot import reward module 'no_such_module_xyz'"):
        load_reward("no_such_module_xyz:f")
    with pytest.raises(ConfigError, match="has no attribute 'nope'"):
        load_reward("math:nope")
    with pytest.raises(ConfigError, match="is not module:function"):
        load_reward("math:")
    with pytest.raises(ConfigError, match=r"unknown reward 'nonesuch'; built-ins: deterministic_random, exact_match"):
        load_reward("nonesuch")


def test_an_installed_plugin_loads_from_the_entry_point_group(plugin_dir):
    _module(plugin_dir, "rw_installed", "def half(**kwargs):\n    return 0.5\n")
    dist = plugin_dir / "rw_installed-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rw-installed\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nhalf = rw_installed:half\n")
    reward = load_reward("half")
    assert score(reward, _samples(1)) == [0.5]


@pytest.mark.parametrize(
    ("body", "what"),
    [
        ("raise KeyError('boom')", "raised KeyError: 'boom'"),
        ("return float('nan')", "returned nan"),
        ("return float('inf')", "returned inf"),
        ("return '1.0'", "returned a str, not a float"),
        ("return None", "returned a NoneType, not a float"),
    ],
)
def test_a_failing_plugin_fails_the_rollout_naming_plugin_and_sample(plugin_dir, body, what):
    src = f"def r(*, prompt, **kwargs):\n    if prompt == 'p3':\n        {body}\n    return 1.0\n"
    mod = _module(plugin_dir, f"rw_fail{abs(hash(body)) % 10**8}", src)
    with pytest.raises(RewardError) as e:
        score(load_reward(f"{mod}:r"), _samples())
    assert e.value.exit_code == 2  # a user error, never the internal-error exit 3
    assert e.value.message == f"reward '{mod}:r' {what} on sample 3"
    assert (e.value.reward, e.value.index) == (f"{mod}:r", 3)


def test_numpy_scalars_and_ints_are_floats():
    import numpy as np

    assert score(LoadedReward("np", lambda **kw: np.float32(0.25)), _samples(1)) == [0.25]
    assert math.isclose(score(LoadedReward("int", lambda **kw: 2), _samples(1))[0], 2.0)


def test_determinism_check_reports_a_plugin_whose_scores_move(plugin_dir):
    src = "import itertools\n_n = itertools.count()\ndef r(**kwargs):\n    return float(next(_n))\n"
    reward = load_reward(f"{_module(plugin_dir, 'rw_counter', src)}:r")
    moved = check_determinism(reward, _samples(20), count=4)
    assert [m.index for m in moved] == determinism_subset(20, 4) == [0, 5, 10, 15]
    assert [(m.first, m.second) for m in moved] == [(0.0, 4.0), (1.0, 5.0), (2.0, 6.0), (3.0, 7.0)]
    assert check_determinism(load_reward("deterministic_random"), _samples(20)) == []


def test_compare_rewards_lists_every_sample_not_matching_its_recorded_reward_bitwise():
    reward = load_reward("exact_match")
    samples = _samples(4)  # "answer i" with label i: all 1.0
    assert compare_rewards(reward, samples, [1.0, 1.0, 1.0, 1.0]) == []
    moved = compare_rewards(reward, samples, [1.0, 0.0, 1.0, 1.0 - 2**-52])
    assert [(m.index, m.first, m.second) for m in moved] == [(1, 0.0, 1.0), (3, 1.0 - 2**-52, 1.0)]
    with pytest.raises(ValueError, match="4 samples but 3 recorded"):
        compare_rewards(reward, samples, [1.0] * 3)
