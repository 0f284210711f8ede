"""scripts/fit_linear_tile_costs.py: it recovers the coefficients of timings that follow the model
exactly, the model it fits on the committed H100 runs picks a tile within 4% of the fastest at every
point above the decode range (the property tests/cpp/linear/dispatch_test.cpp checks for the table
in dispatch.cpp), its decode rule at M <= 64 is within 2% of the fastest tile of the run after
short-M tiles stopped loading TMA's zero fill, and files that are not bench output are refused
with a message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "perf-log" / "data"
H100_RUNS = [DATA / "linear-deepseek-v3-m1-4096-2026-12-05-h100.json",
             DATA / "linear-deepseek-v3-7168x16384-m64-4096-2026-12-05-h100.json"]
# Every fast tile, narrow and wide ones included, at M = 1, 64, 128, 512, 4096.
H100_ALL_TILES = DATA / "linear-deepseek-v3-2026-12-06-h100.json"
# Every fast tile (split-K and cluster ones included) at M = 1, 8, 16, ... 4096, after tiles of an
# M shorter than the tile stopped loading TMA's zero fill (the runs above predate it: their
# M <= 64 times are of the kernel before).
# Every tile at M = 1 ... 4096 (the run dispatch_test checks the rule against).
H100_FULL = DATA / "linear-deepseek-v3-full-2026-12-06-h100.json"


@pytest.fixture()
def fit(repo_script):
    return repo_script("scripts/fit_linear_tile_costs.py")


def _bench_file(path: Path, points, sms: int = 132) -> Path:
    path.write_text(json.dumps({"sm_count": sms, "points": points}))
    return path


def test_timings_that_follow_the_model_give_back_its_coefficients(fit, tmp_path):
    truth = {"cuda.sm90_wgmma.m128n128": (1.5, 3.5), "cuda.sm90_wgmma.m64n64": (0.75, 2.0),
             "cuda.sm90_wgmma.m256n128_x2": (2.5, 7.0),
             "cuda.sm90_wgmma.m64n128_overlap_splitk4": (2.0, 2.6)}
    points = []
    for m, n, k in [(1, 2112, 7168), (512, 7168, 16384), (4096, 4096, 7168), (256, 32768, 512),
                    (2048, 24576, 1536)]:
        timings = [{"name": "cublaslt", "blocks": "128x128", "us": 1.0},
                   {"name": "cuda.sm90_wgmma_any.m64n64", "blocks": "128x128", "us": 1.0}]
        for name, (setup, per_k) in truth.items():
            bm, bn = fit.tile_of(name)
            split = fit.split_of(name)
            us = fit.waves(m, n, bm, bn, 132, fit.cluster_of(name), split) * \
                (setup + per_k * k / split / 1000)
            timings.append({"name": name + (" *" if bm == 64 else ""), "blocks": "128x128",
                            "us": us})
        points.append({"m": m, "n": n, "k": k, "timings": timings})
    costs = fit.fit(fit.load_points([_bench_file(tmp_path / "run.json", points)]))
    assert set(costs) == set(truth)  # only the fast path's tiles, the " *" mark dropped
    for name, (setup, per_k) in truth.items():
        assert costs[name][0] == pytest.approx(setup, rel=1e-9)
        assert costs[name][1] == pytest.approx(per_k, rel=1e-9)


def _above_decode(fit, points):
    return [p for p in points if p["m"] > fit.DECODE_MAX_M]


def test_the_model_fitted_on_the_h100_run_is_within_4_percent_above_decode(fit):
    points = fit.load_points(H100_RUNS)
    quality = fit.evaluate(_above_decode(fit, points), fit.fit(points))
    assert quality["points"] == 36
    assert quality["worst_ratio"] <= 1.04, quality["worst_at"]


def test_the_model_fitted_on_every_tile_is_within_4_percent_above_decode(fit):
    points = fit.load_points([H100_ALL_TILES])
    costs = fit.fit(points)
    assert len(costs) == 9
    quality = fit.evaluate(_above_decode(fit, points), costs)
    assert quality["points"] == 18
    assert quality["worst_ratio"] <= 1.04, quality["worst_at"]


def test_the_decode_rule_is_within_2_percent_of_the_fastest_tile(fit):
    # The full run of 2026-12-06 timed every decode tile of the rule, m64n32_overlap included.
    points = [p for p in fit.load_points([H100_FULL]) if p["m"] <= fit.DECODE_MAX_M]
    assert len(points) == 6 * 5  # M = 1, 8, 16, 32, 64 on the six shapes
    for p in points:
        chosen = fit.decode_choice(list(p["us"]), p)
        assert p["us"][chosen] <= 1.02 * min(p["us"].values()), (p["m"], p["n"], chosen)
    # The widest tile whose waves are as full as any: N = 2112 -> 132 64x16 tiles, 4096 -> 128
    # 64x32, 7168 -> 112 64x64, 24576 -> 384 64x64 (three full waves, not 192 64x128 in two),
    # 32768 -> 256 64x128.
    at_m1 = {p["n"]: fit.decode_choice(list(p["us"]), p) for p in points if p["m"] == 1}
    assert at_m1 == {2112: "cuda.sm90_wgmma.m64n16", 4096: "cuda.sm90_wgmma.m64n32_overlap",
                     7168: "cuda.sm90_wgmma.m64n64", 24576: "cuda.sm90_wgmma.m64n64",
                     32768: "cuda.sm90_wgmma.m64n128_overlap"}


def test_the_command_prints_the_cpp_table_or_json(fit, capsys):
    assert fit.main([str(p) for p in H100_RUNS]) == 0
    table = capsys.readouterr().out
    assert table.startswith("constexpr std::array<TileCost, 4> kTileCosts{{")
    assert '"cuda.sm90_wgmma.m64n64", 64, 64,' in table
    assert fit.main(["--json"] + [str(p) for p in H100_RUNS]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["costs"]) == {"cuda.sm90_wgmma.m128n128", "cuda.sm90_wgmma.m64n128",
                                    "cuda.sm90_wgmma.m64n128_overlap", "cuda.sm90_wgmma.m64n64"}


def test_tiles_fits_only_those_and_keeps_every_timed_tile_as_the_yardstick(fit, capsys):
    # The rule's own tiles (dispatch.cpp's kTileCosts) out of a run that timed more: the others
    # get no cost, and a point where one of them was fastest counts against the rule.
    points = fit.load_points([H100_FULL])
    costs = fit.fit(points, ["m256n128", "m128n128", "m64n64"])
    assert set(costs) == {"cuda.sm90_wgmma.m256n128", "cuda.sm90_wgmma.m128n128",
                          "cuda.sm90_wgmma.m64n64"}
    quality = fit.evaluate(_above_decode(fit, points), costs)
    assert quality["points"] == 36
    for choice in quality["choices"]:
        assert choice["chosen"] in costs
        p = next(q for q in points if (q["m"], q["n"], q["k"]) ==
                 (choice["m"], choice["n"], choice["k"]))
        assert choice["ratio"] == pytest.approx(p["us"][choice["chosen"]] / min(p["us"].values()))
    assert quality["worst_ratio"] > 1.04  # three tiles do not match the fastest of all
    assert fit.main(["--tiles", "m256n128,m99n7", str(H100_FULL)]) == 2
    assert "not timed in the given files: m99n7" in capsys.readouterr().err


def test_a_cluster_counts_its_tiles_along_n_as_one_unit_on_half_the_slots(fit):
    assert fit.cluster_of("cuda.sm90_wgmma.m256n128_x2") == 2
    assert fit.cluster_of("cuda.sm90_wgmma.m64n128_overlap") == 1
    # M = 4096, N = 7168: 16 x 56 tiles of 256 x 128 = 896 on 132 SMs is 7 waves; as 448 pairs on
    # 66 cluster slots, also 7. N = 2112: 17 tiles along N make 9 pairs (the last one half past N).
    assert fit.waves(4096, 7168, 256, 128, 132) == 7
    assert fit.waves(4096, 7168, 256, 128, 132, 2) == 7
    assert fit.waves(4096, 2112, 256, 128, 132, 2) == 3  # 16 x 9 = 144 units on 66 slots
    with pytest.raises(ValueError, match="not a wgmma tile name"):
        fit.cluster_of("cublaslt")


def test_a_split_k_tile_is_one_unit_on_split_blocks_each_streaming_k_over_split(fit):
    name = "cuda.sm90_wgmma.m64n128_overlap_splitk4"
    assert fit.tile_of(name) == (64, 128)
    assert (fit.cluster_of(name), fit.split_of(name)) == (1, 4)
    assert fit.split_of("cuda.sm90_wgmma.m64n64") == 1
    # M = 64, N = 2112: 17 tiles on 33 slots of 4 blocks is one wave; N = 24576: 192 tiles, 6.
    assert fit.waves(64, 2112, 64, 128, 132, 1, 4) == 1
    assert fit.waves(64, 24576, 64, 128, 132, 1, 4) == 6
    point = {"m": 64, "n": 2112, "k": 7168, "sms": 132}
    assert fit.modeled_us((2.0, 2.6), name, point) == pytest.approx(2.0 + 2.6 * 7.168 / 4)


def test_files_that_are_not_bench_output_are_refused(fit, tmp_path, capsys):
    other = tmp_path / "moe.json"
    other.write_text(json.dumps({"preset": "gpt-oss-120b", "points": []}))
    assert fit.main([str(other)]) == 2
    assert "not `mxq bench linear --json` output" in capsys.readouterr().err
    # One K per tile cannot separate the setup from the per-K cost.
    single = _bench_file(tmp_path / "one.json", [{"m": 64, "n": 2112, "k": 7168, "timings": [
        {"name": "cuda.sm90_wgmma.m64n64", "blocks": "128x128", "us": 18.0}]}])
    assert fit.main([str(single)]) == 2
    assert "cannot separate setup from per-K cost" in capsys.readouterr().err
