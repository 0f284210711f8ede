"""Every ```python block of docs/python.md runs (in order, each in a fresh namespace)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "python.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_doc_has_examples():
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_example_runs(index, capsys):
    exec(compile(BLOCKS[index], f"{DOC.name}[block {index}]", "exec"), {"__name__": "__doc_example__"})
