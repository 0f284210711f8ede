"""Shared fixtures: the installed `mxq` package, its bundled CLI, synthetic checkpoints and the
repository's scripts imported as modules."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def import_script(relative: str):
    """A repository script (bench/*.py, scripts/*.py) imported as a module named after its file,
    registered in sys.modules (dataclasses look their module up there)."""
    path = REPO / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def repo_script():
    """import_script for one test: what it imported leaves sys.modules afterwards."""
    names = []

    def load(relative: str):
        module = import_script(relative)
        names.append(module.__name__)
        return module

    yield load
    for name in names:
        sys.modules.pop(name, None)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """Runs the C++ CLI through `python -m mxq` and fails the test with its stderr on error."""
    result = subprocess.run([sys.executable, "-m", "mxq", *args], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.fail(f"mxq {' '.join(args)} exited {result.returncode}: {result.stderr}")
    return result


def _torch():
    try:
        import torch  # noqa: F401

        return torch
    except ImportError:
        return None


def pytest_configure(config):
    # scripts/test_python.sh installs torch and sets MXQ_REQUIRE_TORCH=1: there the torch tests
    # must run, never be skipped because the install silently went missing.
    if os.environ.get("MXQ_REQUIRE_TORCH") == "1" and _torch() is None:
        raise pytest.UsageError("MXQ_REQUIRE_TORCH=1 but `import torch` fails: the torch tests "
                                "would be skipped (install torch into this environment)")
    # The same script installs transformers for mxq.integrations.transformers' tests.
    if os.environ.get("MXQ_REQUIRE_TORCH") == "1" and not _importable("transformers"):
        raise pytest.UsageError("MXQ_REQUIRE_TORCH=1 but `import transformers` fails: the "
                                "transformers integration's tests would be skipped (install "
                                "transformers >= 5.17 into this environment)")
    # scripts/gpu_python_check.sh sets MXQ_REQUIRE_CUDA=1 on the GPU machine: likewise for the
    # CUDA tests.
    if os.environ.get("MXQ_REQUIRE_CUDA") == "1" and not _cuda_available():
        raise pytest.UsageError("MXQ_REQUIRE_CUDA=1 but torch sees no CUDA GPU: the CUDA tests "
                                "would be skipped")


def _importable(name: str) -> bool:
    try:
        __import__(name)
        return True
    except ImportError:
        return False


def _cuda_available() -> bool:
    torch = _torch()
    return bool(torch is not None and torch.cuda.is_available())


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU and PyTorch with CUDA")
    skip_torch = pytest.mark.skip(reason="needs PyTorch")
    for item in items:
        if "cuda" in item.keywords and not _cuda_available():
            item.add_marker(skip_cuda)
        if "torch" in item.keywords and _torch() is None:
            item.add_marker(skip_torch)


@pytest.fixture(scope="session")
def moe_checkpoint(tmp_path_factory) -> Path:
    """A small gpt-oss-layout checkpoint (E=8, H=128, I=96: uneven TP splits and padding)."""
    path = tmp_path_factory.mktemp("moe") / "ckpt"
    run_cli("synth", "gpt-oss", str(path), "--experts", "8", "--hidden", "128",
            "--intermediate", "96", "--top-k", "2", "--layers", "2", "--seed", "7")
    return path
