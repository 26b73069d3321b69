"""The JSONL prompt reader: records in file order, every malformed line an exit-2 error naming it."""

import json

import pytest

from ftkit.errors import ConfigError, InputError
from ftkit.tasks.jsonl import JsonlPrompts


def _write(tmp_path, lines, name="p.jsonl"):
    path = tmp_path / name
    path.write_bytes(b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines))
    return path


def test_reads_prompts_and_labels_in_order_with_their_line(tmp_path):
    path = _write(tmp_path, [json.dumps({"q": "one?", "a": "1"}), json.dumps({"q": "two?", "a": 2, "x": [1]})])
    records = list(JsonlPrompts(path, input_key="q", label_key="a"))
    assert [(r.text, r.label, r.source) for r in records] == [
        ("one?", "1", f"{path}:1"),
        ("two?", "2", f"{path}:2"),
    ]
    # iterating again reads the file again and yields the same records; a float label keeps its JSON text
    assert list(JsonlPrompts(path, "q", "a")) == records
    assert next(iter(JsonlPrompts(_write(tmp_path, ['{"q": "x", "a": 0.5}'], "f.jsonl"), "q", "a"))).label == "0.5"


def test_no_label_key_gives_no_labels_and_ignores_other_keys(tmp_path):
    path = _write(tmp_path, [json.dumps({"prompt": "hi", "answer": "3"})])
    assert [r.label for r in JsonlPrompts(path)] == [None]


def test_a_last_line_without_newline_is_read(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "b"}')
    assert [r.text for r in JsonlPrompts(path)] == ["a", "b"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"prompt": "a"', "is not valid JSON"),
        (b"[1, 2]", "holds a JSON list, not an object"),
        (b'{"text": "a", "answer": "1"}', "has no key 'prompt' (keys: 'text', 'answer')"),
        (b'{"prompt": 7, "answer": "1"}', "key 'prompt' holds a int, not a string"),
        (b'{"prompt": "  ", "answer": "1"}', "key 'prompt' holds an empty prompt"),
        (b'{"prompt": "a"}', "has no key 'answer'"),
        (b'{"prompt": "a", "answer": null}', "key 'answer' holds a NoneType"),
        (b'{"prompt": "a", "answer": true}', "key 'answer' holds a bool"),
        (b"", "is empty"),
        (b'{"prompt": "\xff"}', "is not valid UTF-8"),
    ],
)
def test_a_malformed_line_is_a_config_error_naming_file_and_line(tmp_path, line, message):
    path = _write(tmp_path, ['{"prompt": "fine", "answer": "1"}', line, '{"prompt": "after", "answer": "2"}'])
    ds = JsonlPrompts(path, "prompt", "answer")
    it = iter(ds)
    assert next(it).text == "fine"  # streaming: the good line before is yielded first
    with pytest.raises(ConfigError) as e:
        next(it)
    assert e.value.exit_code == 2
    assert e.value.message.startswith(f"{path}:2 ")
    assert message in e.value.message
    assert "line 2" in e.value.hint


def test_a_missing_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        JsonlPrompts(tmp_path / "nope.jsonl")
