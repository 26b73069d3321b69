"""A reward plug-in written exactly as docs/rl.md tells a user: the page's example module saved
into a directory on sys.path, loaded by module:function, and the page's usage block run as is."""

import re
import sys
from pathlib import Path

import pytest

from ftkit.errors import ConfigError

DOC = Path(__file__).resolve().parents[2] / "docs" / "rl.md"


def _block_after(marker: str) -> str:
    match = re.search(re.escape(marker) + r"\n```python\n(.*?)\n```", DOC.read_text(), re.S)
    assert match, f"docs/rl.md has no python block after {marker}"
    return match.group(1) + "\n"


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(_block_after("<!-- plugin-example: my_rewards.py -->"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("my_rewards", None)


def test_the_documented_plugin_loads_and_scores_as_documented(user_dir):
    exec(compile(_block_after("<!-- plugin-usage -->"), "docs/rl.md", "exec"), {})


def test_the_documented_second_plugin_uses_the_token_ids(user_dir):
    from ftkit.tasks.protocols import RewardSample
    from ftkit.tasks.rewards import load_reward, score

    reward = load_reward("my_rewards:short_and_right")
    got = score(reward, [RewardSample("q", "5", "5", [1], [4, 4])])
    assert got == [1.0 - 0.002]


def test_the_documented_plugin_without_a_label_fails_naming_plugin_and_sample(user_dir):
    from ftkit.tasks.protocols import RewardSample
    from ftkit.tasks.rewards import RewardError, load_reward, score

    with pytest.raises(RewardError, match=r"reward 'my_rewards:contains_answer' raised ValueError: .* on sample 1"):
        score(load_reward("my_rewards:contains_answer"), [RewardSample("q", "1", "1", [1], [2])] * 1
              + [RewardSample("q", "1", None, [1], [2])])  # fmt: skip


def test_a_misspelled_function_is_a_config_error(user_dir):
    from ftkit.tasks.rewards import load_reward

    with pytest.raises(ConfigError, match="reward module 'my_rewards' has no attribute 'contains_answers'"):
        load_reward("my_rewards:contains_answers")


def test_a_plugin_in_the_working_directory_loads_without_touching_pythonpath(tmp_path, monkeypatch):
    from ftkit.tasks.rewards import load_reward

    (tmp_path / "my_rewards.py").write_text(_block_after("<!-- plugin-example: my_rewards.py -->"))
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(Path.cwd()))])
    monkeypatch.chdir(tmp_path)
    try:
        assert load_reward("my_rewards:contains_answer").name == "my_rewards:contains_answer"
    finally:
        sys.modules.pop("my_rewards", None)
