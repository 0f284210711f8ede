"""How `pip install .` builds: in a temporary folder of its own by default (scikit-build-core's
default build-dir), so two builds of one checkout never share a CMake build folder and a read-only
or shared checkout installs; a persistent folder is an opt-in for development (docs/python.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
OPT_IN = "build-python/{wheel_tag}"  # the persistent folder scripts/test_python.sh asks for


def _read_settings(config_settings, env):
    reader = pytest.importorskip("scikit_build_core.settings.skbuild_read_settings")
    return reader.SettingsReader.from_file(PYPROJECT, config_settings, state="wheel",
                                           env=env).settings


def test_pyproject_names_no_build_folder_in_the_source_tree():
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        tomllib = pytest.importorskip("tomli")
    table = tomllib.loads(PYPROJECT.read_text())["tool"]["scikit-build"]
    assert "build-dir" not in table, (
        f"pyproject.toml sets build-dir = {table.get('build-dir')!r}: every `pip install .` of "
        "this checkout would build there (two builds race in it, a read-only checkout fails)")


def test_scikit_build_builds_in_a_temporary_folder_unless_asked_for_one():
    # No config-settings, no SKBUILD_* variables: scikit-build-core's "" = a unique temporary
    # directory for this build.
    assert _read_settings({}, env={}).build_dir == ""
    # The development opt-ins that docs/python.md and scripts/test_python.sh use.
    assert _read_settings({"build-dir": OPT_IN}, env={}).build_dir == OPT_IN
    assert _read_settings({}, env={"SKBUILD_BUILD_DIR": OPT_IN}).build_dir == OPT_IN
