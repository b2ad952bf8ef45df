"""The examples in docs/api.md run, in order, in one namespace, in an empty directory."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def test_api_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = FENCE.findall((ROOT / "docs" / "api.md").read_text(encoding="utf-8"))
    assert len(blocks) >= 5
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "docs_api"}
    for number, block in enumerate(blocks, 1):
        code = compile(block, f"docs/api.md block {number}", "exec")
        exec(code, namespace)  # the documentation's own examples
    assert (tmp_path / "out" / "step-1500.rp").is_file()
