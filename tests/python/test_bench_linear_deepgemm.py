"""bench/linear_deepgemm.py: its inputs are DeepGEMM's layouts (MN-major activation scales), its
emulation and mxq's op agree (--check on the CPU), the check fails when the emulation is wrong,
and bad arguments are refused. The timing against DeepGEMM needs a GPU and a DeepGEMM build."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mxq.torch_ops")

@pytest.fixture()
def bench(repo_script):
    return repo_script("bench/linear_deepgemm.py")


@pytest.mark.parametrize("m", [1, 5, 8])
def test_activation_scales_are_mn_major_and_tma_aligned(bench, m):
    x = torch.randn(m, 300, generator=torch.Generator().manual_seed(m))
    q, scale = bench.quantize_rows(x)
    ld = -(-m // 4) * 4
    assert q.dtype == torch.float8_e4m3fn and q.shape == (m, 300)
    assert scale.shape == (m, 3) and scale.stride() == (1, ld)
    # Dequantized within E4M3's half-ulp (2^-4 relative) of each group's amax-scaled input.
    back = q.float() * scale.repeat_interleave(128, dim=1)[:, :300]
    amax = x.abs().view(m, -1)[:, :256].amax(-1)
    assert (back - x).abs().max() <= 2 ** -4 * x.abs().max()
    assert torch.equal(scale[:, 0], x[:, :128].abs().amax(-1).clamp_min(1e-4) / 448)
    assert amax.numel() == m


def test_mxq_and_the_emulation_agree(bench, capsys):
    assert bench.main(["--check", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["check"]) == 4
    for row in result["check"]:
        assert 0 < row["normalized_difference"] <= result["tolerance"]


def test_row_major_scales_give_the_same_output(bench):
    # mxq's op reads the scales by their strides: DeepGEMM's MN-major layout and vLLM's
    # row-major [M, G] give the same bits.
    s = bench.make_set(5, 256, 384, seed=3, device=torch.device("cpu"))
    bench.run_mxq(s)
    mn_major = s["out"].clone()
    s["x_scale"] = s["x_scale"].contiguous()
    bench.run_mxq(s)
    assert torch.equal(s["out"], mn_major)


def test_the_check_fails_on_a_wrong_emulation(bench, monkeypatch):
    real = bench.emulate

    def first_group_only(x_q, x_scale, w_q, w_scale):  # every K group with group 0's scale
        return real(x_q, x_scale[:, :1].expand_as(x_scale), w_q, w_scale)

    monkeypatch.setattr(bench, "emulate", first_group_only)
    assert bench.main(["--check", "--json"]) == 1


@pytest.mark.parametrize("args", [["--shape", "7168"], ["--shape", "0,512"], ["--m", "0"],
                                  ["--m", "x"], ["--repeats", "5", "--device", "cpu"]])
def test_bad_arguments_are_refused(bench, args):
    with pytest.raises(SystemExit) as info:
        bench.main(args)
    assert info.value.code == 2
