"""load_config: JSON, YAML and TOML through real parsers, and only JSON data comes out."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from restorepoint import ConfigError, NotFound, UsageError, load_config

EXPECTED = {
    "lr": 0.001,
    "model": {"width": 64, "act": "gelu", "layers": [1, 2, 3]},
    "train": {"checkpoint_every": 500, "resume": True, "note": None},
    "name": "ünï",
}

SOURCES = {
    ".json": (
        '{"lr": 0.001, "model": {"width": 64, "act": "gelu", "layers": [1, 2, 3]},'
        ' "train": {"checkpoint_every": 500, "resume": true, "note": null}, "name": "ünï"}'
    ),
    ".yaml": """
lr: 0.001
model:
  width: 64
  act: gelu
  layers: [1, 2, 3]
train:
  checkpoint_every: 500
  resume: true
  note: null
name: ünï
""",
    ".toml": """
lr = 0.001
name = "ünï"

[model]
width = 64
act = "gelu"
layers = [1, 2, 3]

[train]
checkpoint_every = 500
resume = true
""",
}


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".yml", ".toml", ".JSON", ".YML"])
def test_each_format(tmp_path: Path, suffix: str) -> None:
    source = SOURCES[{".yml": ".yaml"}.get(suffix.lower(), suffix.lower())]
    config = load_config(write(tmp_path, f"config{suffix}", source))
    expected: dict[str, Any] = {
        **EXPECTED,
        "model": dict(EXPECTED["model"]),
        "train": dict(EXPECTED["train"]),
    }
    if suffix.lower() == ".toml":
        del expected["train"]["note"]  # TOML has no null
    assert config == expected
    assert type(config) is dict


@pytest.mark.parametrize(("text", "expected"), [(SOURCES[".json"], EXPECTED), ("a: 1\n", {"a": 1})])
@pytest.mark.parametrize("name", ["config.cfg", "config", "config.txt"])
def test_unknown_suffix_is_json_then_yaml(
    tmp_path: Path, name: str, text: str, expected: dict[str, Any]
) -> None:
    assert load_config(write(tmp_path, name, text)) == expected


def test_path_may_be_a_string(tmp_path: Path) -> None:
    assert load_config(str(write(tmp_path, "c.json", '{"a": 1}'))) == {"a": 1}


@pytest.mark.parametrize(
    ("name", "text", "key"),
    [
        ("c.yaml", "start: 2024-01-01\n", "start"),
        ("c.yaml", "run:\n  when: 2024-01-01 10:00:00\n", "run.when"),
        ("c.yaml", "dates: [1, 2024-01-01]\n", "dates[1]"),
        ("c.toml", "start = 1979-05-27\n", "start"),
        ("c.toml", "[run]\nwhen = 1979-05-27T07:32:00Z\n", "run.when"),
        ("c.toml", "at = 07:32:00\n", "at"),
        ("c.yaml", "blob: !!binary aGVsbG8=\n", "blob"),
        ("c.yaml", "s: !!set {a, b}\n", "s"),
    ],
)
def test_values_that_are_not_json_data(tmp_path: Path, name: str, text: str, key: str) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"at {key} " in info.value.message
    assert info.value.url == str(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("name", "text", "key"),
    [
        ("c.yaml", "lr: .nan\n", "lr"),
        ("c.yaml", "opt:\n  lr: .inf\n", "opt.lr"),
        ("c.yaml", "opt:\n  lr: -.inf\n", "opt.lr"),
        ("c.toml", "lr = nan\n", "lr"),
        ("c.toml", "[opt]\nlr = inf\n", "opt.lr"),
        ("c.yaml", "x: [1, .nan]\n", "x[1]"),
    ],
)
def test_non_finite_numbers(tmp_path: Path, name: str, text: str, key: str) -> None:
    with pytest.raises(ConfigError, match="not a finite number") as info:
        load_config(write(tmp_path, name, text))
    assert f"at {key} " in info.value.message


@pytest.mark.parametrize(
    "text", ['{"lr": NaN}', '{"lr": Infinity}', '{"lr": -Infinity}', '{"a": {"b": [NaN]}}']
)
def test_json_constants(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match=r"NaN|Infinity"):
        load_config(write(tmp_path, "c.json", text))


@pytest.mark.parametrize(
    ("name", "text", "key"),
    [
        ("c.json", '{"steps": 9007199254740992}', "steps"),
        ("c.json", '{"a": {"b": -9007199254740992}}', "a.b"),
        ("c.yaml", "seeds: [1, 100000000000000000000]\n", "seeds[1]"),
        ("c.toml", "[train]\nsteps = 9223372036854775807\n", "train.steps"),
    ],
)
def test_integers_beyond_two_to_the_53(tmp_path: Path, name: str, text: str, key: str) -> None:
    with pytest.raises(ConfigError, match="beyond 2") as info:
        load_config(write(tmp_path, name, text))
    assert f"at {key} " in info.value.message


def test_largest_safe_integers_are_kept(tmp_path: Path) -> None:
    text = '{"max": 9007199254740991, "min": -9007199254740991}'
    assert load_config(write(tmp_path, "c.json", text)) == {
        "max": 2**53 - 1,
        "min": -(2**53 - 1),
    }


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("c.json", "[1, 2]"),
        ("c.json", '"text"'),
        ("c.json", "3"),
        ("c.json", "null"),
        ("c.yaml", "- a\n- b\n"),
        ("c.yaml", "just a string\n"),
        ("c.yaml", ""),
        ("c.yaml", "# only a comment\n"),
        ("c.cfg", "[1]"),
    ],
)
def test_top_level_must_be_a_mapping(tmp_path: Path, name: str, text: str) -> None:
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(write(tmp_path, name, text))


@pytest.mark.parametrize(
    ("text", "key", "where"),
    [
        ("1: a\n", "1", "(root)"),
        ("model:\n  2: x\n", "2", "model"),
        ("ok: {true: 1}\n", "True", "ok"),
        ("l: [{null: 1}]\n", "None", "l[0]"),
    ],
)
def test_non_string_keys(tmp_path: Path, text: str, key: str, where: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "c.yaml", text))
    assert info.value.message == f"config key {key} at {where} is not a string"


def test_unhashable_yaml_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a valid config file"):
        load_config(write(tmp_path, "c.yaml", "? [a, b]\n: 1\n"))


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("c.json", '{"a": 1,}'),
        ("c.json", "{'a': 1}"),
        ("c.yaml", "a: [1, 2\n"),
        ("c.yaml", "a: 1\n a: 2\n  - b"),
        ("c.toml", "a = \n"),
        ("c.toml", "a = 1\na = 2\n"),
        ("c.cfg", "{not: [json, nor yaml"),
    ],
)
def test_syntax_errors_are_one_line(tmp_path: Path, name: str, text: str) -> None:
    with pytest.raises(ConfigError, match="not a valid config file") as info:
        load_config(write(tmp_path, name, text))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("c.json", '{"a":' * 10000 + "1" + "}" * 10000),
        ("c.json", "[" * 10000 + "]" * 10000),
        ("c.yaml", "a: " + "[" * 10000 + "]" * 10000 + "\n"),
        ("c.cfg", '{"a":' * 10000 + "1" + "}" * 10000),
    ],
)
def test_nesting_bombs(tmp_path: Path, name: str, text: str) -> None:
    with pytest.raises(ConfigError, match="nested deeper than 63"):
        load_config(write(tmp_path, name, text))


def test_nesting_within_the_limit_is_kept(tmp_path: Path) -> None:
    text = '{"a":' * 63 + "1" + "}" * 63
    config = load_config(write(tmp_path, "c.json", text))
    for _ in range(62):
        config = config["a"]
    assert config == {"a": 1}
    with pytest.raises(ConfigError, match="nested deeper"):
        load_config(write(tmp_path, "d.json", '{"a":' * 64 + "1" + "}" * 64))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(NotFound) as info:
        load_config(tmp_path / "absent.json")
    assert info.value.url == str(tmp_path / "absent.json")


def test_a_directory_is_not_a_config(tmp_path: Path) -> None:
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(ConfigError, match="cannot read") as info:
        load_config(tmp_path / "dir.json")
    assert isinstance(info.value, UsageError)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(path)


def test_unreadable_file(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode")
    path = write(tmp_path, "c.json", '{"a": 1}')
    path.chmod(0)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(path)
