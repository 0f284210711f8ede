"""scripts/perf_page.py renders docs/PERF.md's tables from bench JSON and --check catches a page
that differs; scripts/perf_plots.py draws the charts (skipped without matplotlib). The bench JSON
here are fixtures (tests/python/fixtures/perf_*_bench_fixture.json): hand-made numbers in the
shape `mxq bench moe|linear --json` prints, not measurements."""

from __future__ import annotations

import copy
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import import_script

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
MOE_FIXTURE = FIXTURES / "perf_moe_bench_fixture.json"
LINEAR_FIXTURE = FIXTURES / "perf_linear_bench_fixture.json"
MOE_NAME = "moe-gpt-oss-120b-2026-12-06.json"
LINEAR_NAME = "linear-deepseek-v3-2026-12-06.json"

PAGE = """# A page

Text before.

<!-- perf:moe begin -->
*transcribed: no JSON yet*
<!-- perf:moe end -->

Text between.

<!-- perf:moe-phases begin -->
<!-- perf:moe-phases end -->

<!-- perf:linear begin -->
*transcribed: no JSON yet*
<!-- perf:linear end -->

Text after.
"""


perf_page = import_script("scripts/perf_page.py")


@pytest.fixture
def site(tmp_path):
    """docs/PERF.md with the markers and an empty docs/perf-data/."""
    docs = tmp_path / "docs"
    (docs / "perf-data").mkdir(parents=True)
    (docs / "PERF.md").write_text(PAGE)
    return docs


def add_data(docs: Path, moe: bool = True, linear: bool = True) -> None:
    if moe:
        shutil.copy(MOE_FIXTURE, docs / "perf-data" / MOE_NAME)
    if linear:
        shutil.copy(LINEAR_FIXTURE, docs / "perf-data" / LINEAR_NAME)


def run(docs: Path, *extra: str) -> tuple[int, str]:
    out = io.StringIO()
    args = ["--page", str(docs / "PERF.md"), "--data", str(docs / "perf-data"), *extra]
    try:
        status = perf_page.process(docs / "PERF.md", docs / "perf-data", "--check" in extra, out)
    except perf_page.PageError as e:
        return 2, str(e)
    assert perf_page.main(args) == status  # the command line gives the same answer
    return status, out.getvalue()


def block(text: str, name: str) -> str:
    return text.split(f"<!-- perf:{name} begin -->\n")[1].split(f"<!-- perf:{name} end -->")[0]


def test_fixtures_have_the_bench_shape():
    moe = json.loads(MOE_FIXTURE.read_text())
    assert {"preset", "experts", "hidden", "intermediate_per_rank", "intermediate_padded", "top_k",
            "tp", "copy_ceiling_gbps", "cold_l2", "points"} == set(moe)
    p = moe["points"][0]
    assert {"tokens", "mxq", "read_floor", "baseline_bf16", "speedup_vs_baseline",
            "relative_difference_vs_baseline"} == set(p)
    assert {"gemm_variant", "resolved_variant", "programmatic_launch", "total_us",
            "layer_in_graph_us", "routing_us", "gemm1_us", "gemm2_us", "combine_us",
            "touched_experts", "touched_weight_bytes", "effective_gbps", "pct_of_copy_ceiling",
            "tflops"} == set(p["mxq"])
    assert {"bytes", "total_us", "in_graph_us", "gbps", "blocks_per_sm", "one_pass_us",
            "layer_over_floor"} == set(p["read_floor"])
    linear = json.loads(LINEAR_FIXTURE.read_text())
    assert {"gpu", "sm_count", "cublaslt_version", "preset", "repeats", "method",
            "points"} == set(linear)
    assert {"n", "k", "m", "input_sets", "timings", "cublaslt_orientation",
            "cublaslt_vs_mxq_normalized_difference"} == set(linear["points"][0])


def test_without_json_check_passes_and_says_so(site):
    status, out = run(site, "--check")
    assert status == 0
    assert out.count("nothing to check") == 3
    status, out = run(site)  # writing without JSON leaves the page as it is
    assert status == 0 and (site / "PERF.md").read_text() == PAGE


def test_renders_the_moe_tables(site):
    add_data(site, linear=False)
    status, out = run(site)
    assert status == 0 and "perf:moe: written from " + MOE_NAME in out
    text = (site / "PERF.md").read_text()
    moe = block(text, "moe")
    assert "transcribed" not in moe
    assert f"[{MOE_NAME}](perf-data/{MOE_NAME})" in moe
    assert "2026-12-06" in moe and "copy ceiling in the same run 4235 GB/s" in moe
    assert ("`mxq bench moe --preset gpt-oss-120b --tokens 1,8,64,4096 --default-only --json`"
            in moe)
    assert ("| T | µs | in graph µs | GB/s (touched) | % of copy | TFLOPS | read floor µs | "
            "floor in graph µs | layer / floor | bf16 baseline µs | speed-up |") in moe
    # total, in graph, GB/s, % of copy, TFLOPS, floor, floor in graph, ratio, baseline, speed-up
    assert "| 1 | 33.6 | 29.4 | 1576 | 37.2 | 5.9 | 20.2 | 17.3 | 1.66× | 216.2 | 6.43× |" in moe
    assert "| 4096 | 2004 | 1998 | 846 | 20.0 | 407 | 389.4 | 386.0 | 5.15× | 3806 | 1.90× |" in moe
    phases = block(text, "moe-phases")
    assert "| 1 | `register_stream` | 4.0 | 6.1 | 17.9 | 9.8 | 3.4 | 33.6 |" in phases
    assert "| 4096 | `wgmma_tile` | 128.0 | 112.3 | 1296 | 628.8 | 58.3 | 2004 |" in phases
    assert "| 64 | 1470.2 | 336.6 | 333.9 | 325.4 | 4368 | 4 |" in phases
    # Text outside the markers and the block without JSON are untouched.
    assert text.startswith("# A page\n\nText before.\n") and text.endswith("Text after.\n")
    assert block(text, "linear") == "*transcribed: no JSON yet*\n"
    status, out = run(site, "--check")
    assert status == 0 and "perf:moe: matches" in out and "nothing to check" in out


def test_renders_the_linear_tables(site):
    add_data(site, moe=False)
    assert run(site)[0] == 0
    linear = block((site / "PERF.md").read_text(), "linear")
    assert "NVIDIA H200; 2026-12-06; 132 SMs; cuBLASLt 13.1.0;" in linear
    assert "`mxq bench linear --preset deepseek-v3 --m 64,4096 --repeats 30 --json`" in linear
    # mxq = the dispatch's choice ("*"), its TFLOPS, the fastest tactic when another, cuBLASLt
    assert ("| 2112, 7168 | 64 | 18.8 | 103 | `sm90_wgmma.m64n64` | 18.8 | 17.7 | 109 | 0.94× |"
            in linear)
    assert ("| 7168, 16384 | 64 | 39.2 | 383 | `sm90_wgmma.m64n64` | 38.6 "
            "(`sm90_wgmma.m64n128_overlap`) | 43.9 | 342 | 1.12× |") in linear
    # geomean per M of cuBLASLt µs / mxq µs: sqrt(17.7/18.8 * 43.9/39.2) = 1.03
    assert "| 64 | 1.03× | 0.94–1.12× | 2 |" in linear
    assert "| 4096 | 0.83× | 0.81–0.86× | 2 |" in linear
    assert "| 2112, 7168 | 4096 | 214.8 | 577 | `sm90_wgmma_any.m128n128` | 0.66 |" in linear
    assert "normalized difference ≤ 3.6e-05" in linear


def test_linear_read_floor_and_ceiling_columns_when_timed(site):
    # A run that timed each point's read floor and per-tensor FP8 GEMM gets a column for each,
    # and the per-M table the dispatch's speed against the per-tensor GEMM's.
    data = json.loads(LINEAR_FIXTURE.read_text())
    floors, ceilings = [9.9, 20.0, 42.0, 80.0], [12.0, 180.0, 40.0, 600.0]
    for p, floor, ceiling in zip(data["points"], floors, ceilings):
        p["read_floor"] = {"total_us": floor, "bytes": 1.0, "gbps": 1.0}
        p["ceiling"] = {"us": ceiling, "tflops": 1.0, "name": "cublaslt per-tensor FP8"}
    (site / "perf-data" / LINEAR_NAME).write_text(json.dumps(data))
    assert run(site)[0] == 0
    linear = block((site / "PERF.md").read_text(), "linear")
    assert "| mxq speed / cuBLASLt | read floor µs | per-tensor FP8 µs |" in linear
    assert ("| 2112, 7168 | 64 | 18.8 | 103 | `sm90_wgmma.m64n64` | 18.8 | 17.7 | 109 | 0.94× "
            "| 9.9 | 12.0 |") in linear
    # M = 64: the read floor's speed sqrt(17.7 / 9.9 * 43.9 / 42.0) = 1.37, the dispatch's against
    # the per-tensor GEMM sqrt(12.0 / 18.8 * 40.0 / 39.2) = 0.81
    assert "| M | geomean speed | range | shapes | read floor's speed (geomean) |" in linear
    assert "| 64 | 1.03× | 0.94–1.12× | 2 | 1.37× | 0.81× |" in linear
    assert "| 4096 | 0.83× | 0.81–0.86× | 2 | 7.47× |" in linear
    assert "Per-tensor FP8: cuBLASLt's FP8 GEMM" in linear
    assert run(site, "--check")[0] == 0


def test_check_catches_a_mismatch(site):
    add_data(site)
    assert run(site)[0] == 0
    assert run(site, "--check")[0] == 0
    page = site / "PERF.md"
    good = page.read_text()
    # One number edited by hand.
    page.write_text(good.replace("| 1 | 33.6 | 29.4 |", "| 1 | 31.0 | 29.4 |"))
    status, out = run(site, "--check")
    assert status == 1
    assert "perf:moe: differs" in out and "-| 1 | 31.0 | 29.4 |" in out
    assert page.read_text() != good  # --check writes nothing
    # New JSON for the same kind: the newest date wins and the old table no longer matches.
    page.write_text(good)
    data = json.loads(LINEAR_FIXTURE.read_text())
    data["points"][0]["timings"][1]["us"] = 17.0
    (site / "perf-data" / "linear-deepseek-v3-2026-12-07.json").write_text(json.dumps(data))
    status, out = run(site, "--check")
    assert status == 1 and "perf:linear: differs from what linear-deepseek-v3-2026-12-07" in out
    assert run(site)[0] == 0 and run(site, "--check")[0] == 0
    assert "| 2112, 7168 | 64 | 17.0 |" in page.read_text()


def test_a_transcribed_block_fails_check_once_json_exists(site):
    add_data(site, linear=False)
    status, out = run(site, "--check")
    assert status == 1 and "-*transcribed: no JSON yet*" in out


def test_meta_file_and_variants(site):
    add_data(site, linear=False)
    meta = {"gpu": "NVIDIA H200", "driver": "580.159.04", "cuda": "13.0", "commit": "abc1234",
            "command": "mxq bench moe --preset gpt-oss-120b --tokens 1,8,64,4096 --repeats 20 "
                       "--default-only --json"}
    (site / "perf-data" / MOE_NAME.replace(".json", ".meta.json")).write_text(json.dumps(meta))
    data = json.loads(MOE_FIXTURE.read_text())
    for p in data["points"]:
        variant = copy.deepcopy(p["mxq"])
        variant["programmatic_launch"] = False
        variant["total_us"] = p["mxq"]["total_us"] * 1.25
        p["mxq_no_pdl"] = variant
    (site / "perf-data" / MOE_NAME).write_text(json.dumps(data, indent=2))
    assert run(site)[0] == 0
    text = (site / "PERF.md").read_text()
    moe = block(text, "moe")
    assert "NVIDIA H200; driver 580.159.04; CUDA 13.0; 2026-12-06; commit abc1234;" in moe
    assert f"Command: `{meta['command']}`" in moe
    phases = block(text, "moe-phases")
    assert "| 1 | default without PDL | 42.0 |" in phases and "| 1.25× |" in phases


def test_bad_markers_are_errors(site):
    page = site / "PERF.md"
    page.write_text(PAGE.replace("<!-- perf:linear end -->\n", ""))
    assert run(site, "--check")[0] == 2
    page.write_text(PAGE.replace("<!-- perf:moe-phases begin -->\n<!-- perf:moe-phases end -->\n",
                                 ""))
    status, message = run(site, "--check")
    assert status == 2 and "perf:moe-phases" in message
    page.write_text(PAGE + "<!-- perf:moe begin -->\n<!-- perf:moe end -->\n")
    assert run(site, "--check")[0] == 2


def test_unreadable_json_is_an_error(site):
    (site / "perf-data" / MOE_NAME).write_text("{ not json")
    assert run(site, "--check")[0] == 2


def test_plots(site):
    pytest.importorskip("matplotlib")
    perf_plots = import_script("scripts/perf_plots.py")
    add_data(site)
    assert perf_plots.main(["--data", str(site / "perf-data")]) == 0
    for name in (MOE_NAME, LINEAR_NAME):
        png = site / "perf-data" / name.replace(".json", ".png")
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The page links a chart once it exists.
    assert run(site)[0] == 0
    text = (site / "PERF.md").read_text()
    assert f"(perf-data/{MOE_NAME.replace('.json', '.png')})" in block(text, "moe")
    assert f"(perf-data/{LINEAR_NAME.replace('.json', '.png')})" in block(text, "linear")
    assert run(site, "--check")[0] == 0


def test_the_repository_page_matches_its_data():
    """docs/PERF.md against docs/perf-data/, as CI runs it (passes while no JSON is there)."""
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "perf_page.py"), "--check"],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
