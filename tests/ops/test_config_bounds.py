"""Configs are bounded before they are built: a YAML alias bomb, a recursive alias, too many
aliases and an oversized file are refused with one ConfigError line (exit 2), and anchors used
the ordinary way still load."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from restorepoint import ConfigError, load_config
from restorepoint.ops._config import MAX_CONFIG_BYTES, MAX_YAML_ALIASES

#: Nine levels of nine aliases: 9**9 (387 million) strings from a file of 600 bytes.
LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)


def test_a_billion_laughs_is_refused_by_the_cli_under_a_memory_limit(tmp_path: Path) -> None:
    bomb = tmp_path / "lol.yaml"
    bomb.write_text(LAUGHS)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    proc = subprocess.run(
        [sys.executable, "-m", "restorepoint", "check", f"{tmp_path}/none.rp", "--config",
         str(bomb)],
        capture_output=True, text=True, timeout=60, preexec_fn=limit, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "expands to more than" in lines[0], proc.stderr


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("a: &a [1, *a]\n", "recursive YAML alias"),
        ("a: &a 1\nb: [" + ", ".join(["*a"] * (MAX_YAML_ALIASES + 1)) + "]\n", "YAML aliases"),
    ],
    ids=["recursive", "too-many-aliases"],
)
def test_yaml_alias_shapes_are_refused(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=said) as info:
        load_config(path)
    assert info.value.exit_code == 2


@pytest.mark.parametrize("suffix", [".json", ".toml", ".yaml"])
def test_an_oversized_config_is_refused_before_it_is_parsed(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"big{suffix}"
    path.write_bytes(b" " * (MAX_CONFIG_BYTES + 1))
    with pytest.raises(ConfigError, match="larger than"):
        load_config(path)


def test_anchors_and_merge_keys_used_the_ordinary_way_still_load(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("base: &b {x: 1, y: [1, 2]}\nother:\n  <<: *b\n  z: 3\nc: *b\n")
    assert load_config(path) == {
        "base": {"x": 1, "y": [1, 2]},
        "other": {"x": 1, "y": [1, 2], "z": 3},
        "c": {"x": 1, "y": [1, 2]},
    }
