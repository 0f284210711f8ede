"""scripts/gpu_ab.sh: `stage` packs each build's sources (a commit, a commit with patches applied
in order, or the working tree) and refuses a bad spec without touching what was staged; `build`
unpacks each and runs its own scripts/gpu_check.sh (here a stand-in) with the cores shared, keeps a
tree whose sources did not change and reports a failed build; `bench` runs every build each
round, in reverse order every other round, keeps each output, and for a linear bench prints
scripts/linear_ab.py's comparison."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import REPO


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    """A git checkout holding the two scripts and a source file, one commit."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    for script in ("gpu_ab.sh", "linear_ab.py"):
        shutil.copy(REPO / "scripts" / script, root / "scripts" / script)
    (root / ".gitignore").write_text("/.ab/\n/build*/\n/.deps/\n")
    (root / "kernel.cuh").write_text("int stages = 5;\n")
    # The GPU machine's build, stood in for: records its arguments, fails where a file says so.
    fake = root / "scripts" / "gpu_check.sh"
    fake.write_text("""#!/usr/bin/env bash
set -e
cd "$(dirname "$0")/.."
mkdir -p build-gpu
echo "$MXQ_BUILD_JOBS $MXQ_BUILD_TARGETS" > build-gpu/args
test -f .deps/marker
if [[ -f fail ]]; then echo "error: boom"; exit 1; fi
printf '#!/bin/sh\\necho built\\n' > build-gpu/mxq
chmod +x build-gpu/mxq
""")
    fake.chmod(0o755)
    (root / ".deps").mkdir()
    (root / ".deps" / "marker").write_text("")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    return root


def _ab(repo: Path, *args: str, out: Path | None = None,
        tmpdir: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if out is not None:
        env["OUT"] = str(out)
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    return subprocess.run(["bash", "scripts/gpu_ab.sh", *args], cwd=repo, capture_output=True,
                          text=True, env=env)


def _staged_file(repo: Path, build: str, name: str) -> str:
    with tarfile.open(repo / ".ab" / f"{build}.tar.gz") as tar:
        return tar.extractfile(f"./{name}").read().decode()


def _patch(repo: Path, name: str, old: str, new: str) -> Path:
    """A patch file (outside the checkout) that changes kernel.cuh's one line from old to new."""
    path = repo.parent / name
    path.write_text(f"--- a/kernel.cuh\n+++ b/kernel.cuh\n@@ -1 +1 @@\n-{old}+{new}")
    return path


def test_stage_packs_a_commit_a_patched_commit_and_the_working_tree(repo):
    one = _patch(repo, "one.patch", "int stages = 5;\n", "int stages = 6;\n")
    two = _patch(repo, "two.patch", "int stages = 6;\n", "int stages = 7;\n")  # after one only
    (repo / "kernel.cuh").write_text("int stages = 8;\n")  # the working tree, uncommitted
    result = _ab(repo, "stage", "base=HEAD", f"p1=HEAD+{one}", f"p12=HEAD+{one}+{two}",
                 "wt=worktree")
    assert result.returncode == 0, result.stderr
    assert (repo / ".ab" / "builds").read_text().split() == ["base", "p1", "p12", "wt"]
    assert _staged_file(repo, "base", "kernel.cuh") == "int stages = 5;\n"
    assert _staged_file(repo, "p1", "kernel.cuh") == "int stages = 6;\n"
    assert _staged_file(repo, "p12", "kernel.cuh") == "int stages = 7;\n"
    assert _staged_file(repo, "wt", "kernel.cuh") == "int stages = 8;\n"


@pytest.mark.parametrize("spec, message", [
    ("base", "is not NAME=SOURCE"),
    ("9x=HEAD", "must be a letter"),
    ("base=nosuchrev", "is not a commit"),
    ("base=HEAD+missing.patch", "is not a file"),
])
def test_stage_refuses_a_bad_spec_and_keeps_what_was_staged(repo, tmp_path, spec, message):
    assert _ab(repo, "stage", "kept=HEAD").returncode == 0
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    result = _ab(repo, "stage", "ok=HEAD", spec, tmpdir=scratch)
    assert result.returncode == 2
    assert message in result.stderr
    assert (repo / ".ab" / "builds").read_text().split() == ["kept"]
    assert list(scratch.iterdir()) == []  # its scratch folder went too


def test_stage_refuses_a_patch_that_does_not_apply(repo):
    assert _ab(repo, "stage", "kept=HEAD").returncode == 0
    stale = _patch(repo, "stale.patch", "int stages = 5;\n", "int stages = 6;\n")
    _git(repo, "rm", "-q", "kernel.cuh")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "gone")
    scratch = repo.parent / "scratch"
    scratch.mkdir()
    result = _ab(repo, "stage", f"p=HEAD+{stale}", tmpdir=scratch)
    assert result.returncode == 2
    assert "does not apply" in result.stderr
    assert list(scratch.iterdir()) == []
    assert (repo / ".ab" / "builds").read_text().split() == ["kept"]


def test_build_unpacks_each_tree_builds_it_and_keeps_it_while_its_sources_stay(repo, tmp_path):
    assert _ab(repo, "stage", "a=HEAD", "b=HEAD").returncode == 0
    out = tmp_path / "out"
    result = _ab(repo, "build", "mxq_cli", out=out)
    assert result.returncode == 0, result.stderr + result.stdout
    assert result.stdout.split("\n")[:2] == ["built a", "built b"]
    cores = os.cpu_count() or 1
    for build in ("a", "b"):
        args = (repo / "build-ab" / build / "build-gpu" / "args").read_text().split()
        assert args == [str(max(2, -(-cores // 2))), "mxq_cli"]
    # a second call keeps the unpacked tree (an incremental build) ...
    (repo / "build-ab" / "a" / "kept").write_text("")
    assert _ab(repo, "build", out=out).returncode == 0
    assert (repo / "build-ab" / "a" / "kept").exists()
    args = (repo / "build-ab" / "a" / "build-gpu" / "args").read_text().split()
    assert args[1:] == ["mxq_cli", "test_linear_linear_gpu_test"]
    # ... until its sources change
    (repo / "fail").write_text("")
    assert _ab(repo, "stage", "a=worktree", "b=HEAD").returncode == 0
    result = _ab(repo, "build", out=out)
    assert result.returncode != 0
    assert "build of a failed" in result.stderr and "boom" in result.stderr
    assert not (repo / "build-ab" / "a" / "kept").exists()
    assert "built b" in result.stdout


def _fake_build(repo: Path, name: str, log: Path, us: float) -> None:
    """build-ab/NAME/build-gpu/mxq: logs its build's name and prints a one-point linear bench."""
    exe = repo / "build-ab" / name / "build-gpu" / "mxq"
    exe.parent.mkdir(parents=True)
    point = {"points": [{"m": 64, "n": 2112, "k": 7168, "timings": [
        {"name": "cublaslt", "blocks": "128x128", "us": 20.0},
        {"name": "cuda.sm90_wgmma.m64n16 *", "blocks": "128x128", "us": us}]}]}
    exe.write_text(f"#!/bin/sh\necho {name} >> {log}\necho '{json.dumps(point)}'\n")
    exe.chmod(0o755)


def test_bench_interleaves_the_builds_and_compares_a_linear_bench(repo, tmp_path):
    assert _ab(repo, "stage", "base=HEAD", "new=HEAD").returncode == 0
    log = tmp_path / "order.log"
    _fake_build(repo, "base", log, 16.0)
    _fake_build(repo, "new", log, 12.0)
    out = tmp_path / "out"
    result = _ab(repo, "bench", "3", "--", "bench", "linear", "--json", out=out)
    assert result.returncode == 0, result.stderr
    assert log.read_text().split() == ["base", "new", "new", "base", "base", "new"]
    for build in ("base", "new"):
        for round_ in (1, 2, 3):
            assert json.loads((out / "ab" / f"{build}.{round_}.json").read_text())["points"]
    summary = (out / "ab" / "summary.txt").read_text()
    assert "cuda.sm90_wgmma.m64n16" in summary and "0.75" in summary


def test_bench_refuses_builds_that_are_not_built(repo, tmp_path):
    assert _ab(repo, "stage", "base=HEAD").returncode == 0
    result = _ab(repo, "bench", "2", "--", "bench", "linear", out=tmp_path)
    assert result.returncode == 2
    assert "is not built" in result.stderr
    result = _ab(repo, "bench", "two", "--", "bench", out=tmp_path)
    assert result.returncode == 2
    assert "positive integer" in result.stderr
