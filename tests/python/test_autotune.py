"""mxq.autotune(): the C++ autotuner as a context manager that mxq's ops consult."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

import mxq
from mxq import _mxq

PROBLEM_TEXT = ("block_fp8_linear[K=512,N=256,block_k=128,block_n=128|a=e4m3,a_scale=f32,out=bf16,"
                "w=e4m3,w_scale=f32]")


@pytest.fixture(autouse=True)
def no_autotune_environment(monkeypatch, tmp_path):
    for name in ("MXQ_AUTOTUNE", "MXQ_AUTOTUNE_CACHE", "MXQ_AUTOTUNE_SKIP_OPS", "MXQ_AUTOTUNE_BUDGET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MXQ_CACHE_DIR", str(tmp_path / "default-cache"))


class SpyWeight:
    """Records what each forward ran in the C++ op: (tactic, whether the tuner chose it)."""

    def __init__(self, weight, runs):
        self._weight = weight
        self.runs = runs

    def __getattr__(self, name):
        return getattr(self._weight, name)

    def linear(self, x, bias, tactic, scales, out, stream, tuner):
        y, run = self._weight.linear(x, bias, tactic, scales, out, stream, tuner, True)
        self.runs.append((run["tactic"], run["from_tuner"]))
        return y


@pytest.fixture
def linear():
    w = np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32)
    lin = mxq.BlockFp8Linear.quantize(w, (128, 128))
    lin.runs = []
    lin._weight = SpyWeight(lin._weight, lin.runs)
    return lin


DEFAULT = ("cpu.reference", False)  # the dispatch rule's CPU choice


def linear_name(tactic_id: str) -> str:
    """The linear op's tactic behind an autotuner tactic id: "blocked_f32[tile_n=64]" is
    cpu.blocked_f32.n64, "reference" is cpu.reference."""
    if tactic_id == "reference":
        return "cpu.reference"
    variant, params = tactic_id.rstrip("]").split("[")
    return f"cpu.{variant}.n{params.split('=')[1]}"


def tokens(m: int) -> np.ndarray:
    return np.random.default_rng(m).standard_normal((m, 512)).astype(ml_dtypes.bfloat16)


def test_tune_mode_measures_saves_and_serves_the_winner(linear, tmp_path):
    cache = tmp_path / "tactics.json"
    outside = linear.forward(tokens(8))
    with mxq.autotune(cache=str(cache), mode="tune", phase="target") as tuner:
        assert mxq.tune.current() is tuner
        inside = linear.forward(tokens(8))
        again = linear.forward(tokens(7))  # bucket 8 again: nothing new to measure
        assert cache.is_file()  # each winner is saved as soon as it is measured
        explained = linear.explain(8)
    assert mxq.tune.current() is None
    record, hit = tuner.records
    assert (hit["status"], hit["bucket"], hit["tactic"]) == ("hit", 8, record["tactic"])
    assert record["problem"] == PROBLEM_TEXT and record["bucket"] == 8 and record["pass"] == "target"
    assert record["status"] == "tuned" and len(record["candidates"]) >= 2
    winner = tuner._tuner.lookup(_mxq.TuneProblem.block_fp8_linear(256, 512), 8)
    assert winner["source"] == "tuned" and winner["tactic"] == record["tactic"]
    ran = (linear_name(record["tactic"]), True)
    assert linear.runs == [DEFAULT, ran, ran]
    assert explained["from_tuner"] and explained["chosen"] == ran[0]
    assert "token bucket 8" in explained["tuner_note"]
    assert inside.shape == outside.shape == (8, 256) and again.shape == (7, 256)
    entries = json.loads(cache.read_text())["entries"]
    assert [(e["op"], e["shape"]["N"], e["shape"]["K"], e["bucket"], e["pass"], e["tactic"])
            for e in entries] == [("block_fp8_linear", 256, 512, 8, "target", record["tactic"])]
    linear.forward(tokens(8))
    assert linear.runs[-1] == DEFAULT  # outside the block: the op's own dispatch again


def test_load_mode_serves_the_cache_without_measuring(linear, tmp_path):
    cache = str(tmp_path / "tactics.json")
    with mxq.autotune(cache=cache) as first:
        linear.forward(tokens(8))
    tuned = first.records[0]["tactic"]
    before = (tmp_path / "tactics.json").read_text()
    with mxq.autotune(cache=cache, mode="load") as loaded:
        linear.forward(tokens(5))  # bucket 8: served from the cache
        linear.forward(tokens(64))  # not in the cache: the dispatch rule, nothing measured
    assert loaded.records == [] and loaded._tuner.measured_count == 0
    assert [d["tactic"] for d in loaded.decisions()] == [tuned]
    assert linear.runs[-2:] == [(linear_name(tuned), True), DEFAULT]
    assert (tmp_path / "tactics.json").read_text() == before


def test_passes_merge_and_an_exception_still_saves(linear, tmp_path):
    cache = str(tmp_path / "tactics.json")
    with pytest.raises(KeyError):
        with mxq.autotune(cache=cache, phase="target"):
            linear.forward(tokens(8))
            raise KeyError("model failed")
    with mxq.autotune(cache=cache, phase="draft"):
        linear.forward(tokens(2), out_dtype="f32")  # another problem: f32 output
    entries = json.loads((tmp_path / "tactics.json").read_text())["entries"]
    assert sorted((e["bucket"], e["pass"], e["dtypes"]["out"]) for e in entries) == [
        (2, "draft", "f32"), (8, "target", "bf16")]


def test_nested_contexts_and_off_mode(linear, tmp_path):
    with mxq.autotune(cache=str(tmp_path / "a.json")) as outer:
        with mxq.autotune(mode="off") as inner:
            assert mxq.tune.current() is inner and inner.cache_path == ""
            linear.forward(tokens(4))
        assert mxq.tune.current() is outer
    assert linear.runs == [DEFAULT]  # off: the dispatch rule, nothing tuned
    assert not (tmp_path / "a.json").exists() and outer.records == []


def test_fresh_mode_writes_a_new_runs_file(linear, tmp_path):
    cache = tmp_path / "tactics.json"
    with mxq.autotune(cache=str(cache), mode="fresh") as tuner:
        linear.forward(tokens(3))
    assert "/runs/" in tuner.cache_path and tuner.cache_path.endswith(".json")
    assert not cache.exists()
    assert json.loads(open(tuner.cache_path).read())["entries"][0]["bucket"] == 4


def test_only_calls_the_tuner_serves_consult_it(linear, tmp_path):
    with mxq.autotune(cache=str(tmp_path / "t.json")) as tuner:
        assert tuner.serves("cpu") and not tuner.serves("cuda", 0)  # CPU tactics only
        linear.forward(tokens(8), tactic="cpu.reference")  # an explicit tactic is kept
        assert tuner.linear_tuner("cuda", 0, 256, 512, (128, 128), "fp32", "bf16", 8) is None
    assert linear.runs == [("cpu.reference", False)] and tuner.records == []


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"^mode: expected one of off, load, tune, fresh"):
        mxq.autotune(mode="fast")
    with pytest.raises(ValueError, match=r"^device: "):
        mxq.autotune(device="tpu")
    with pytest.raises(ValueError, match=r"^device: "):
        mxq.autotune(device="cuda:x")
    context = mxq.autotune(mode="off")
    with context:
        with pytest.raises(RuntimeError, match="already active"):
            context.__enter__()


def test_a_directory_is_no_cache_and_is_left_alone(linear, tmp_path):
    folder = tmp_path / "mydir"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep")
    for mode in ("tune", "load"):
        with pytest.raises(ValueError, match="expected a file path"):
            mxq.autotune(cache=str(folder), mode=mode)
    assert folder.is_dir() and (folder / "notes.txt").read_text() == "keep"
    assert not list(tmp_path.glob("mydir.corrupt-*"))


def test_skip_ops_may_be_one_name(linear, tmp_path):
    with mxq.autotune(cache=str(tmp_path / "c.json"), skip_ops="block_fp8_linear") as tuner:
        linear.forward(tokens(8))
    assert [r["status"] for r in tuner.records] == ["skipped"]


def test_cpu_moe_forward_tunes_and_serves_expert_tilings(moe_checkpoint, tmp_path):
    """Inside mxq.autotune() the CPU MoE forward tunes each rank's moe_expert_gemm problem for
    its token bucket, then serves the winner; every tiling gives bit-identical output."""
    layer = mxq.MoELayer.from_checkpoint(moe_checkpoint, tp_size=2, align=128)
    x = np.random.default_rng(3).standard_normal((5, layer.config["hidden_size"]))
    x = x.astype(np.float32)
    plain = layer.forward_details(x)
    assert plain.rank_tactics == ["reference", "reference"]
    assert plain.rank_tactics_from_cache == [False, False]
    cache = tmp_path / "moe.json"
    keys = [layer._core.tune_problem(r).canonical for r in range(2)]
    with mxq.autotune(cache=str(cache), mode="tune") as tuner:
        tuned = layer.forward_details(x)
        assert {r["problem"] for r in tuner.records} == set(keys)
        decisions = {(d["problem"], d["bucket"]): d["tactic"] for d in tuner.decisions()}
    assert np.array_equal(tuned.output, plain.output)
    assert np.array_equal(tuned.accumulator, plain.accumulator)
    # What the cache holds for bucket 8 (5 tokens) is what a load-mode forward runs.
    expected = [decisions[(key, 8)] for key in keys]
    with mxq.autotune(cache=str(cache), mode="load"):
        served = layer.forward_details(x)
    assert served.rank_tactics == expected
    assert served.rank_tactics_from_cache == [True, True]
    assert np.array_equal(served.output, plain.output)
    # Off mode serves nothing: the layer's own tiling.
    with mxq.autotune(cache=str(cache), mode="off"):
        assert layer.forward_details(x).rank_tactics == ["reference", "reference"]
