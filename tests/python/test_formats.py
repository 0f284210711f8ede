"""mxq.formats against ml_dtypes as an independent oracle, on every code and >= 10^6 values."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import mxq
from mxq import formats

N_RANDOM = 1 << 20


def random_f32(seed: int, n: int = N_RANDOM) -> np.ndarray:
    """Values over the whole float32 range: random bit patterns plus normal data of mixed scale,
    plus the edge values (zeros, infinities, extremes, subnormals)."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 1 << 32, size=n // 2, dtype=np.uint64).astype(np.uint32).view(np.float32)
    scaled = (rng.standard_normal(n - n // 2) * np.exp2(rng.integers(-20, 12, n - n // 2))).astype(np.float32)
    edges = np.array([0.0, -0.0, np.inf, -np.inf, 6.0, 5.0, 0.25, 0.75, 448.0, 464.0, 464.1, 1e-45,
                      np.finfo(np.float32).max, -np.finfo(np.float32).max, 2.0**-127, 2.0**-126],
                     np.float32)
    return np.concatenate([bits, scaled, edges])


def same_bits_or_both_nan(a: np.ndarray, b: np.ndarray) -> bool:
    a32 = np.asarray(a, np.float32)
    b32 = np.asarray(b, np.float32)
    nan = np.isnan(a32)
    return bool(np.array_equal(nan, np.isnan(b32))
                and np.array_equal(a32[~nan].view(np.uint32), b32[~nan].view(np.uint32)))


# --- E2M1 ---------------------------------------------------------------------------------

def test_e2m1_decode_all_codes():
    codes = np.arange(16, dtype=np.uint8)
    oracle = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert same_bits_or_both_nan(formats.e2m1_decode(codes), oracle)  # includes 8 -> -0.0


def test_e2m1_encode_random():
    x = random_f32(1)
    x = x[~np.isnan(x)]  # E2M1 has no NaN: ml_dtypes and CUDA differ there
    oracle = x.astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    got = formats.e2m1_encode(x)
    assert got.dtype == np.uint8 and np.array_equal(got, oracle)


def test_e2m1_decode_rejects_codes_above_15():
    with pytest.raises(ValueError, match="codes"):
        formats.e2m1_decode(np.array([3, 16], np.uint8))


# --- E4M3 ---------------------------------------------------------------------------------

def test_e4m3_decode_all_codes_uint8_and_ml_dtypes():
    codes = np.arange(256, dtype=np.uint8)
    oracle = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert same_bits_or_both_nan(formats.e4m3_decode(codes), oracle)
    assert same_bits_or_both_nan(formats.e4m3_decode(codes.view(ml_dtypes.float8_e4m3fn)), oracle)


def test_e4m3_encode_nonsaturating_random():
    x = random_f32(2)
    got = formats.e4m3_encode(x, saturate=False)
    assert got.dtype == ml_dtypes.float8_e4m3fn
    oracle = x.astype(ml_dtypes.float8_e4m3fn)
    assert same_bits_or_both_nan(got.astype(np.float32), oracle.astype(np.float32))
    # Codes, not only values: every non-NaN code is identical (this includes the sign of zero).
    keep = ~np.isnan(oracle.astype(np.float32))
    assert np.array_equal(got.view(np.uint8)[keep], oracle.view(np.uint8)[keep])


def test_e4m3_encode_saturating_random():
    x = random_f32(3)
    x = x[~np.isnan(x)]
    got = formats.e4m3_encode(x)  # quantizers' mode: overflow and infinities clamp to ±448
    oracle = np.clip(x, -448.0, 448.0).astype(ml_dtypes.float8_e4m3fn)
    assert np.array_equal(got.view(np.uint8), oracle.view(np.uint8))


# --- E8M0 ---------------------------------------------------------------------------------

def test_e8m0_decode_all_codes():
    codes = np.arange(256, dtype=np.uint8)
    oracle = codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    got = formats.e8m0_decode(codes)
    assert same_bits_or_both_nan(got, oracle)
    assert got[0] == np.float32(2.0**-127) and np.isnan(got[255])  # never 0 or Inf


@np.errstate(invalid="ignore")
def e8m0_oracle(x: np.ndarray, rounding: str) -> np.ndarray:
    """The power of two |x| rounds to (exact, via frexp in float64), clamped to [2^-127, 2^127],
    then converted by ml_dtypes (exact for a power of two); NaN -> 0xFF."""
    a = np.abs(x.astype(np.float64))  # float32 -> float64 is exact (NaN payloads aside)
    mantissa, exponent = np.frexp(a)
    floor_pow = np.ldexp(1.0, exponent - 1)
    with np.errstate(invalid="ignore"):
        p = floor_pow if rounding == "floor" else np.where(a > floor_pow, 2 * floor_pow, floor_pow)
    p = np.where(a == 0, 2.0**-127, p)
    p = np.where(np.isinf(a), 2.0**127, p)
    p = np.clip(p, 2.0**-127, 2.0**127)
    p = np.where(np.isnan(a), np.nan, p)
    return p.astype(np.float32).astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)


@pytest.mark.parametrize("rounding", ["floor", "ceil"])
def test_e8m0_encode_random(rounding):
    x = random_f32(4)
    got = formats.e8m0_encode(x, rounding)
    assert got.dtype == ml_dtypes.float8_e8m0fnu
    assert np.array_equal(got.view(np.uint8), e8m0_oracle(x, rounding))


def test_e8m0_bad_rounding_names_argument():
    with pytest.raises(ValueError, match="rounding"):
        formats.e8m0_encode(np.ones(2, np.float32), "nearest")


# --- MXFP4 --------------------------------------------------------------------------------

def mxfp4_oracle(x: np.ndarray, rule: str):
    """OCP MX v1.0 (floor) or ceil scales from the block amax, elements through ml_dtypes' E2M1."""
    blocks = x.reshape(-1, 32).astype(np.float64)
    amax = np.abs(blocks).max(axis=1)
    if rule == "floor":
        e = np.frexp(amax)[1] - 1 - 2  # floor(log2 amax) - 2
    else:
        ratio_pow = np.frexp(amax / 6.0)
        exact = ratio_pow[0] == 0.5
        e = np.where(exact, ratio_pow[1] - 1, ratio_pow[1])
    e = np.where(amax == 0, -127, e)
    scale = np.ldexp(1.0, e.astype(np.int64))
    elements = (blocks / scale[:, None]).astype(np.float32).astype(ml_dtypes.float4_e2m1fn)
    codes = elements.view(np.uint8)
    codes = np.where(blocks == 0, 0, codes)  # zeros encode as +0 (sign dropped), as in the design
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    scale_codes = np.clip(e + 127, 0, 254).astype(np.uint8)
    return packed.reshape(*x.shape[:-1], x.shape[-1] // 32, 16), scale_codes.reshape(*x.shape[:-1], -1)


@pytest.mark.parametrize("rule", ["floor", "ceil"])
def test_mxfp4_quantize_matches_oracle(rule):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((N_RANDOM // 64, 64)) * np.exp2(rng.integers(-30, 30, (N_RANDOM // 64, 1)))).astype(np.float32)
    x[0, :32] = 0.0
    blocks, scales = formats.quantize_mxfp4(x, scale_rule=rule)
    want_blocks, want_scales = mxfp4_oracle(x, rule)
    assert scales.dtype == ml_dtypes.float8_e8m0fnu
    assert np.array_equal(scales.view(np.uint8), want_scales)
    assert np.array_equal(blocks, want_blocks)
    # dequantization = code value * scale, checked through ml_dtypes again
    codes = np.stack([blocks & 0xF, blocks >> 4], axis=-1).reshape(x.shape)
    values = codes.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    expect = values * np.repeat(scales.astype(np.float64), 32, axis=-1)
    assert same_bits_or_both_nan(formats.dequantize_mxfp4(blocks, scales), expect.astype(np.float32))


def test_mxfp4_nonfinite_block_gives_nan_scale_and_nan_output():
    x = np.ones((2, 32), np.float32)
    x[1, 3] = np.inf
    blocks, scales = formats.quantize_mxfp4(x)
    assert scales.view(np.uint8)[1, 0] == 0xFF and scales.view(np.uint8)[0, 0] != 0xFF
    y = formats.dequantize_mxfp4(blocks, scales)
    assert np.isnan(y[1]).all() and np.isfinite(y[0]).all()


def test_mxfp4_bad_scale_rule():
    with pytest.raises(ValueError, match="scale_rule"):
        formats.quantize_mxfp4(np.ones((1, 32), np.float32), scale_rule="round")


def test_mxfp4_accepts_bf16_input():
    x = np.random.default_rng(6).standard_normal((8, 64)).astype(np.float32)
    xb = x.astype(ml_dtypes.bfloat16)
    got = formats.quantize_mxfp4(xb)
    want = formats.quantize_mxfp4(xb.astype(np.float32))  # bf16 -> f32 is exact
    assert all(np.array_equal(a.view(np.uint8), b.view(np.uint8)) for a, b in zip(got, want))


# --- block-FP8 ----------------------------------------------------------------------------

def fp8_block_oracle(x: np.ndarray, bn: int, bk: int, mode: str):
    n, k = x.shape
    rb, cb = -(-n // bn), -(-k // bk)
    scale = np.empty((rb, cb), np.float32)
    q = np.empty_like(x, dtype=ml_dtypes.float8_e4m3fn)
    for i in range(rb):
        for j in range(cb):
            blk = x[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]
            amax = np.float32(np.abs(blk).max())
            s = np.float32(max(amax, np.float32(1e-4))) / np.float32(448.0)
            if mode == "ue8m0":
                s = np.float32(e8m0_oracle(np.array([s], np.float32), "ceil").view(ml_dtypes.float8_e8m0fnu).astype(np.float32)[0])
            scale[i, j] = s
            q[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = np.clip(blk / s, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    return q, scale


@pytest.mark.parametrize("mode", ["fp32", "ue8m0"])
@pytest.mark.parametrize("block", [(128, 128), (64, 32), (1, 128)])
def test_fp8_block_quantize_matches_oracle(block, mode):
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((200, 300)) * np.exp2(rng.integers(-8, 8, (200, 1)))).astype(np.float32)
    q, scale = formats.quantize_fp8_block(x, block, mode)
    want_q, want_scale = fp8_block_oracle(x, *block, mode)
    assert q.dtype == ml_dtypes.float8_e4m3fn and scale.dtype == np.float32
    assert np.array_equal(scale.view(np.uint32), want_scale.view(np.uint32))
    assert np.array_equal(q.view(np.uint8), want_q.view(np.uint8))
    deq = formats.dequantize_fp8_block(q, scale, block)
    expect = want_q.astype(np.float32) * np.repeat(np.repeat(want_scale, block[0], 0), block[1], 1)[:200, :300]
    assert np.array_equal(deq.view(np.uint32), expect.view(np.uint32))


def test_block_shape_tuple_list_string_are_one_value():
    """The seed bug: a (128, 128) tuple and a [128, 128] list must behave identically."""
    x = np.random.default_rng(9).standard_normal((256, 256)).astype(np.float32)
    results = [formats.quantize_fp8_block(x, b) for b in
               [(128, 128), [128, 128], "128x128", mxq.BlockShape(128, 128), np.array([128, 128])]]
    for q, s in results[1:]:
        assert np.array_equal(q.view(np.uint8), results[0][0].view(np.uint8))
        assert np.array_equal(s, results[0][1])
    assert formats.block_shape([128, 128]) == formats.block_shape((128, 128))
    assert mxq.BlockShape(128, 128) == (128, 128) and mxq.BlockShape(128, 128) == [128, 128]
    assert mxq.BlockShape(128, 128) != [128, 64]
    assert hash(formats.block_shape([128, 128])) == hash(formats.block_shape((128, 128)))
    # The linear fast/fallback decision sees the same typed block either way.
    w = x[:, :256]
    a = mxq.BlockFp8Linear.quantize(w, [128, 128]).explain(64)
    b = mxq.BlockFp8Linear.quantize(w, (128, 128)).explain(64)
    assert a["problem"] == b["problem"] and a["chosen"] == b["chosen"]


@pytest.mark.parametrize("bad", [(128,), (0, 128), "128", (128.5, 128), None])
def test_block_shape_rejects_bad_values(bad):
    with pytest.raises((TypeError, ValueError), match="block"):
        formats.quantize_fp8_block(np.ones((4, 4), np.float32), bad)


def test_fp8_groups_equal_block_1xk():
    x = np.random.default_rng(10).standard_normal((7, 256)).astype(np.float32)
    q1, s1 = formats.quantize_fp8_groups(x, 128, "ue8m0")
    q2, s2 = formats.quantize_fp8_block(x, (1, 128), "ue8m0")
    assert np.array_equal(q1.view(np.uint8), q2.view(np.uint8)) and np.array_equal(s1, s2)


# --- packed UE8M0 -------------------------------------------------------------------------

def test_ue8m0_pack_layout_and_round_trip():
    rng = np.random.default_rng(11)
    mn, groups = 7, 10
    exps = rng.integers(-30, 30, (mn, groups))
    scales = np.ldexp(1.0, exps).astype(np.float32)
    packed = formats.pack_ue8m0(scales)
    assert packed.dtype == np.int32 and packed.shape == (3, 8)
    # Independent layout check: byte i of int32 (p, m) is the E8M0 code of group 4p+i of row m.
    raw = packed.view(np.uint8).reshape(3, 8, 4)
    for m in range(8):
        for g in range(12):
            want = exps[m, g] + 127 if (m < mn and g < groups) else 0
            assert raw[g // 4, m, g % 4] == want
    assert np.array_equal(formats.unpack_ue8m0(packed, mn, groups), scales)


def test_ue8m0_pack_rejects_non_power_of_two():
    with pytest.raises(mxq.Error, match="3"):
        formats.pack_ue8m0(np.array([[1.0, 3.0]], np.float32))
