"""bench/transformers_generate.py: a smoke run on the CPU (a tiny gpt-oss, both experts
implementations timed on one model) and its argument checks."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

@pytest.fixture()
def bench(repo_script):
    return repo_script("bench/transformers_generate.py")


def test_a_tiny_run_times_both_experts_implementations(bench, capsys, tmp_path):
    argv = ["--shape", "tiny", "--device", "cpu", "--repeats", "1", "--prompt", "16",
            "--new-tokens", "4", "--checkpoint", str(tmp_path / "gpt-oss"), "--json"]
    assert bench.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    for side in ("mxq", "grouped_mm"):
        assert result[side]["decode_tokens_per_s"] > 0 and result[side]["prefill_ms"] > 0
    assert result["decode_speedup"] == pytest.approx(
        result["mxq"]["decode_tokens_per_s"] / result["grouped_mm"]["decode_tokens_per_s"])
    assert 0 <= result["greedy_tokens_equal_prefix"] <= 4
    assert (tmp_path / "gpt-oss" / "config.json").is_file()  # kept for the next run
    assert result["shape"] == "tiny" and result["device"] == "cpu"


@pytest.mark.parametrize("argv", [["--layers", "0"], ["--new-tokens", "0"], ["--shape", "huge"]])
def test_bad_arguments_are_refused(bench, argv):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(argv + ["--device", "cpu"])
    assert exit_info.value.code == 2
