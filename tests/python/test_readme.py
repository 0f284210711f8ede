"""The README as a newcomer reads it on a clone: every file it names is in the clone, it quotes no
test counts (they go stale), it says what disk the set-up takes and how to leave torch out, and
its two set-up commands are the scripts that exist (with the main job's build-only-what-it-needs
option)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end >= 0 else None]


def test_every_file_the_readme_names_is_in_the_clone():
    links = re.findall(r"\]\(([^)#]+)\)", README)
    named = re.findall(r"`([\w./-]+\.(?:md|sh|py|toml|txt))`", README)
    assert links
    missing = [p for p in links + named
               if not (ROOT / p).exists() and not (ROOT / "docs" / p).exists()
               and not (ROOT / "scripts" / Path(p).name).exists()]
    assert not missing, f"README.md names files a clone does not have: {missing}"


def test_the_readme_quotes_no_test_counts():
    counts = re.findall(r"\b\d+ (?:tests?|cases?) (?:pass|passed|run)\b", README)
    assert not counts, f"test counts go stale: {counts}"


def test_the_setup_says_the_disk_it_needs_and_how_to_leave_torch_out():
    setup = _section("Set-up")
    assert re.search(r"\d+ GB", setup), "the disk the set-up needs"
    assert "torch" in setup and "MXQ_PYTHON_TORCH=0" in setup
    # The variable the README gives is the one the test script reads.
    assert 'MXQ_PYTHON_TORCH:-1}" == 1' in (ROOT / "scripts" / "test_python.sh").read_text()


def test_two_setup_commands_and_a_main_job_without_the_tests():
    setup = _section("Set-up")
    commands = re.findall(r"```sh\n(.*?)```", setup, re.S)
    assert [c.strip() for c in commands] == ["./scripts/run_main.sh", "./scripts/test.sh"]
    assert "./scripts/run_main.sh --no-tests" in setup
    run_main = (ROOT / "scripts" / "run_main.sh").read_text()
    assert '"${1:-}" == --no-tests' in run_main and "-DMXQ_BUILD_TESTS=OFF" in run_main
