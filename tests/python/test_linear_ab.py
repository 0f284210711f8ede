"""scripts/linear_ab.py: a build's time at a point is the median of its rounds, the table gives
the geomean, range and count of its ratios to the baseline's over the points both timed (new
tactics and points left out), the dispatch's choice is compared as "auto" whatever tactic it was,
the record keeps every round, and unusable input is refused with a message and exit code 2."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest


@pytest.fixture()
def ab(repo_script):
    return repo_script("scripts/linear_ab.py")


def _run(path: Path, points) -> Path:
    """A bench file: points as (m, n, k, [(name, blocks, us), ...])."""
    path.write_text(json.dumps({"points": [
        {"m": m, "n": n, "k": k,
         "timings": [{"name": name, "blocks": blocks, "us": us} for name, blocks, us in timings]}
        for m, n, k, timings in points]}))
    return path


def _rows(rows):
    return {(r["build"], r["tactic"], r["blocks"]): r for r in rows}


def test_ratios_are_of_the_medians_of_the_rounds_over_the_common_points(ab, tmp_path):
    tile = "cuda.sm90_wgmma_any.m128n128_overlap"
    base = [_run(tmp_path / f"base_{i}.json", [
        (256, 2112, 7168, [("cublaslt", "128x128", 20.0), (tile + " *", "64x64", us_256)]),
        (4096, 2112, 7168, [("cublaslt", "128x128", 110.0), (tile, "64x64", us_4096)]),
    ]) for i, (us_256, us_4096) in enumerate([(40.0, 200.0), (47.0, 190.0), (42.0, 230.0)])]
    new = [_run(tmp_path / f"new_{i}.json", [
        (256, 2112, 7168, [("cublaslt", "128x128", 20.0), (tile, "64x64", 30.0),
                           ("cuda.sm90_wgmma_any.m128n64 *", "64x64", us)]),
        (4096, 2112, 7168, [("cublaslt", "128x128", 110.0), (tile, "64x64", 150.0)]),
        (1, 2112, 7168, [("cublaslt", "128x128", 17.0), (tile, "64x64", 15.0)]),  # base lacks it
    ]) for i, us in enumerate([21.0, 25.0])]
    builds = {"base": ab.load_build(base), "new": ab.load_build(new)}
    rows = _rows(ab.compare(builds, "base"))
    overlap = rows[("new", tile, "64x64")]
    # medians: base 42 and 200, new 30 and 150; M = 1 is not a common point
    assert overlap["points"] == 2
    assert overlap["geomean"] == pytest.approx(math.sqrt(30 / 42 * 150 / 200))
    assert overlap["min"] == pytest.approx(30 / 42)
    assert overlap["max"] == pytest.approx(150 / 200)
    # the dispatch's choice changed tile at M = 256: "auto" compares whatever each build chose
    assert rows[("new", "auto", "64x64")]["geomean"] == pytest.approx(23.0 / 42)
    assert rows[("new", "cublaslt", "128x128")]["geomean"] == pytest.approx(1.0)
    # a tactic only the new build has is not compared
    assert ("new", "cuda.sm90_wgmma_any.m128n64", "64x64") not in rows
    only_64 = ab.compare(builds, "base", blocks="64x64", tactics=[tile])
    assert [(r["tactic"], r["blocks"]) for r in only_64] == [(tile, "64x64")]
    # the points of some M only
    at_256 = _rows(ab.compare(builds, "base", ms=[256]))[("new", tile, "64x64")]
    assert at_256["points"] == 1 and at_256["geomean"] == pytest.approx(30 / 42)
    assert ab.compare(builds, "base", ms=[1]) == []  # the baseline did not time M = 1


def test_the_record_keeps_every_round_by_point_and_block_shape(ab, tmp_path):
    runs = [_run(tmp_path / f"r{i}.json", [
        (64, 7168, 2048, [("cuda.sm90_wgmma.m64n64 *", "128x128", 11.5 + i),
                          ("cuda.sm90_wgmma_any.m64n64", "64x64", 13.25 + i)])]) for i in range(2)]
    out = tmp_path / "ab.json"
    assert ab.main(["--build", f"base={runs[0]}", "--build", f"new={runs[1]}", "--out", str(out),
                    "--card", "H100", "--date", "2026-12-08", "--command", "mxq bench linear",
                    "--describe", "new=branch x"]) == 0
    written = json.loads(out.read_text())
    assert written["builds"] == {"base": "base", "new": "branch x"}
    assert written["card"] == "H100" and written["command"] == "mxq bench linear"
    point = written["us"]["new"]["7168x2048 M=64"]
    assert point == {"cuda.sm90_wgmma.m64n64": [12.5], "auto": [12.5],
                     "cuda.sm90_wgmma_any.m64n64 64x64": [14.25]}


def test_unusable_input_is_refused_with_a_message(ab, tmp_path, capsys):
    good = _run(tmp_path / "good.json", [(64, 128, 128, [("cublaslt", "128x128", 1.0)])])
    not_bench = tmp_path / "other.json"
    not_bench.write_text(json.dumps({"card": "H100", "us": {}}))
    cases = [
        (["--build", f"base={good}"], "at least two builds"),
        (["--build", f"base={good}", "--build", f"new={not_bench}"], "no \"points\" list"),
        (["--build", f"base={good}", "--build", f"new={tmp_path / 'missing.json'}"],
         "not readable as JSON"),
        (["--build", f"base={good}", "--build", "new"], "expected NAME=VALUE"),
        (["--build", f"base={good}", "--build", f"new={good}", "--baseline", "main"],
         "'main' is not one of the builds"),
        (["--build", f"base={good}", "--build", f"new={good}", "--blocks", "64x64"],
         "no tactic was timed"),
    ]
    for argv, message in cases:
        assert ab.main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
