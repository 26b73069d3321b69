"""--rules files: parsing, validation (no eval, fail closed), first-match semantics."""

from __future__ import annotations

import pytest

from ftkit.dumps.rules import load_rules, rule_set
from ftkit.errors import ConfigError, InputError


def _rules(tmp_path, text):
    p = tmp_path / "rules.toml"
    p.write_text(text)
    return load_rules(p)


def test_first_matching_rule_decides(tmp_path):
    rs = _rules(
        tmp_path,
        """
[[rule]]
name = "grads"
match = 'output_grad'
require = "max_rel <= 1e-2 or bitwise_equal"

[[rule]]
match = 'output'
require = "not (max_abs > 1e-3) and 0 <= dissimilarity < 1e-6 and nan_b == nan_a"
""",
    )
    assert rs.rule_for("x/y:l.output_grad").name == "grads"
    assert rs.rule_for("x/y:l.output").name == "rule 2"
    assert rs.rule_for("x/y:l.param") is None
    grads, out = rs.rules
    assert grads.passes({"max_rel": 0.5, "bitwise_equal": True})
    assert not grads.passes({"max_rel": 0.5, "bitwise_equal": False})
    ok = {"max_abs": 1e-4, "dissimilarity": 1e-9, "nan_a": 0, "nan_b": 0}
    assert out.passes(ok)
    assert not out.passes({**ok, "dissimilarity": -1.0})  # the chained comparison holds both ends
    assert not out.passes({**ok, "nan_b": 1})


@pytest.mark.parametrize(
    "require,needle",
    [
        ("__import__('os').system('x')", "unsupported expression"),
        ("max_abs.real < 1", "unsupported expression"),
        ("max_abs < 1 if True else 2", "unsupported expression"),
        ("max_abs + 1 < 2", "unsupported expression"),
        ("maximum_abs < 1", "unknown name 'maximum_abs'"),
        ("max_abs <", "cannot parse"),
        ("'text' == 'text'", "unsupported expression"),
    ],
)
def test_unsafe_or_unknown_expressions_are_config_errors(tmp_path, require, needle):
    with pytest.raises(ConfigError, match="rule 1") as err:
        _rules(tmp_path, f'[[rule]]\nmatch = "x"\nrequire = "{require}"\n'.replace('"' + require + '"', repr(require)))
    assert needle in err.value.message


@pytest.mark.parametrize(
    "text,needle",
    [
        ("", "non-empty [[rule]] array"),
        ("rule = 1", "non-empty [[rule]] array"),
        ("[[rule]]\nmatch = 'x'\n", "needs 'match' and 'require'"),
        ("[[rule]]\nmatch = 'x'\nrequire = 'true'\ncolour = 1\n", "nothing else"),
        ("[[rule]]\nmatch = '('\nrequire = 'true'\n", "invalid regex"),
        ("[[rule]]\nmatch = 'x'\nrequire = 'true'\n[other]\n", "unknown keys"),
        ("[[rule]\n", "not valid TOML"),
    ],
)
def test_malformed_files(tmp_path, text, needle):
    with pytest.raises(ConfigError) as err:
        _rules(tmp_path, text)
    assert needle in err.value.message


def test_missing_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError):
        load_rules(tmp_path / "nope.toml")


def test_rules_made_in_code_are_checked_as_a_file_s() -> None:
    rs = rule_set([(r":layers\.1\.attention$", "max_abs <= 0.5"), (":logits$", "bitwise_equal")], "in code")
    assert rs.rule_for("check/forward/rollout_000000/step000000:layers.1.attention").passes({"max_abs": 0.25})
    assert rs.rule_for("x:layers.11.attention") is None  # anchored: no other layer matches
    with pytest.raises(ConfigError, match="in code, rule 1: unknown name 'eval'"):
        rule_set([("x", "eval < 1")], "in code")
