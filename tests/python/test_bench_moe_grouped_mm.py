"""bench/moe_grouped_mm.py: its baseline (torch's bf16 grouped GEMM on the dequantized weights)
and mxq's op compute the same layer (--check on the CPU), the check fails when the baseline is
wrong, and bad arguments are refused."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

@pytest.fixture()
def bench(repo_script):
    return repo_script("bench/moe_grouped_mm.py")


def test_mxq_and_the_grouped_mm_baseline_agree(bench, capsys):
    assert bench.main(["--check", "--device", "cpu", "--json", "--tokens", "1,5,33"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [r["tokens"] for r in result["check"]] == [1, 5, 33]
    for row in result["check"]:
        assert 0 < row["normalized_difference"] <= result["tolerance"]


@pytest.mark.parametrize("break_it", ["alpha", "down_bias"])
def test_the_check_fails_on_a_wrong_baseline(bench, capsys, monkeypatch, break_it):
    if break_it == "alpha":
        monkeypatch.setattr(bench, "SWIGLU_ALPHA", 1.0)
    else:
        forward = bench.GroupedMmBaseline.forward

        def without_down_bias(self, x, topk_ids, topk_weights):
            self.layer.w2_bias = torch.zeros_like(self.layer.w2_bias)
            return forward(self, x, topk_ids, topk_weights)

        monkeypatch.setattr(bench.GroupedMmBaseline, "forward", without_down_bias)
    assert bench.main(["--check", "--device", "cpu", "--tokens", "5"]) == 1


def test_the_dequantization_puts_element_2j_in_the_low_nibble(bench):
    layer = bench.random_layer(4, 64, 32, 2, device=torch.device("cpu"), seed=3)
    values = bench.dequantize(layer.w2, layer.w2_scale)
    assert values.dtype == torch.bfloat16 and values.shape == (4, 64, 32)
    # Element 2j is the low nibble: code 0x21 is (0.5, 1.0) times the block's scale.
    layer.w2[0, 0, 0] = 0x21
    layer.w2_scale[0, 0, 0] = 127
    values = bench.dequantize(layer.w2, layer.w2_scale)
    assert values[0, 0, 0].item() == 0.5 and values[0, 0, 1].item() == 1.0


@pytest.mark.parametrize("argv", [["--check", "--device", "cpu", "--tokens", "0"],
                                  ["--check", "--device", "cpu", "--tokens", "a,b"],
                                  ["--device", "cpu"]])
def test_bad_arguments_are_refused(bench, argv):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(argv)
    assert exit_info.value.code == 2
