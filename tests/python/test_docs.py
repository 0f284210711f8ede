"""Every ```python block of docs/python.md runs (in order, each in a fresh namespace); blocks fenced
```python cuda need a GPU (marker `cuda`: skipped without one)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "python.md"
TEXT = DOC.read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", TEXT, flags=re.S)
CUDA_BLOCKS = re.findall(r"```python cuda\n(.*?)```", TEXT, flags=re.S)


def run_block(code: str, name: str) -> None:
    exec(compile(code, f"{DOC.name}[{name}]", "exec"), {"__name__": "__doc_example__"})


def test_doc_has_examples():
    assert len(BLOCKS) >= 6 and len(CUDA_BLOCKS) >= 2
    assert len(re.findall(r"```python", TEXT)) == len(BLOCKS) + len(CUDA_BLOCKS)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_example_runs(index, capsys):
    if "import torch" in BLOCKS[index]:
        pytest.importorskip("torch")  # conftest fails the run instead when torch is required
    run_block(BLOCKS[index], f"block {index}")


@pytest.mark.cuda
@pytest.mark.torch
@pytest.mark.parametrize("index", range(len(CUDA_BLOCKS)))
def test_doc_cuda_example_runs(index, capsys):
    run_block(CUDA_BLOCKS[index], f"cuda block {index}")
