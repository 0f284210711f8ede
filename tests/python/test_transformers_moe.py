"""mxq.integrations.transformers, the MoE half: the "mxq" experts implementation on tiny gpt-oss
and DeepSeek-V4 checkpoints written in their published on-disk format (synth.py), against
transformers' own eager experts on the same dequantized weights; the loader's bytes against
mxq's C++ reader; torch.compile; the errors, which leave the model as it was."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import mxq  # noqa: E402
from mxq.integrations.transformers import MXQ, synth, use_mxq_experts  # noqa: E402
from mxq.torch_ops import Mxfp4MoE  # noqa: E402

pytestmark = pytest.mark.torch

# Logits of the float32 model, mxq against transformers' eager experts on the same MXFP4
# weights: mxq rounds the activations entering each GEMM to bf16 (measured: 2-3e-3 relative,
# 6e-3 absolute at logits of magnitude ~2.5).
REL_TOL, ABS_TOL = 1e-2, 2e-2
NEW_TOKENS = 32
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _needs_accelerate(kind: str) -> None:
    # DeepSeek-V4 checkpoints are FP8 ones: transformers' FP8 quantizer insists on accelerate.
    if kind == "deepseek-v4":
        pytest.importorskip("accelerate", reason="transformers loads FP8 checkpoints only "
                                                 "with accelerate installed")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    # Intermediate sizes 160 and 96 pad to 256 and 128; a SwiGLU limit of 1 makes the tiny
    # random models' pre-activations (std ~0.6) reach the clamps.
    return {"gpt-oss": synth.write_gpt_oss(root / "gpt-oss", seed=1, swiglu_limit=1.0),
            "deepseek-v4": synth.write_deepseek_v4(root / "deepseek-v4", seed=2,
                                                   swiglu_limit=1.0)}


def _dequantize_config(kind: str):
    """transformers' own dequantization of the checkpoint (bf16/fp32 expert weights): the
    eager reference, and the path that needs neither Triton kernels nor a GPU."""
    if kind == "gpt-oss":
        return transformers.Mxfp4Config(dequantize=True)
    return transformers.FineGrainedFP8Config(dequantize=True)


def _load(kind: str, path: Path, device: str = "cpu", **kwargs):
    _needs_accelerate(kind)
    kwargs.setdefault("quantization_config", _dequantize_config(kind))
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                              **kwargs)
    model.generation_config.eos_token_id = None  # 32 tokens, whatever they are
    # transformers 5.17 dequantizes gpt-oss's experts to bf16 whatever the dtype: float32
    # everywhere (exact: MXFP4 values are bf16 values) keeps its eager path runnable.
    return model.float().to(device).eval()


def _ids(device: str, length: int = 8, batch: int = 1) -> "torch.Tensor":
    return torch.randint(0, 250, (batch, length), generator=torch.Generator().manual_seed(3)
                         ).to(device)


def _logits(model, ids, implementation: str) -> "torch.Tensor":
    model.set_experts_implementation(implementation)
    with torch.no_grad():
        return model(ids).logits.float()


def _experts(model):
    return [m for name, m in model.named_modules() if name.endswith("mlp.experts")]


# --- registration and loading ----------------------------------------------------------------

def test_importing_mxq_does_not_import_transformers():
    code = "import sys, mxq, mxq.torch_ops; assert 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_mxq_is_an_experts_implementation_transformers_accepts(checkpoints):
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    assert MXQ in ALL_EXPERTS_FUNCTIONS
    model = _load("gpt-oss", checkpoints["gpt-oss"], experts_implementation="mxq")
    assert model.config._experts_implementation == "mxq"
    # Dispatched to mxq, which has no weights yet: a clear error, not transformers' bf16 path.
    with pytest.raises(mxq.Error, match="use_mxq_experts"):
        model(_ids("cpu"))
    use_mxq_experts(model, checkpoints["gpt-oss"])
    assert torch.isfinite(model(_ids("cpu")).logits).all()


@pytest.mark.parametrize("kind", ["gpt-oss", "deepseek-v4"])
def test_checkpoints_load_in_transformers_without_missing_or_unexpected_keys(checkpoints, kind):
    _needs_accelerate(kind)
    _, info = transformers.AutoModelForCausalLM.from_pretrained(
        checkpoints[kind], quantization_config=_dequantize_config(kind),
        output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys"))


def test_gpt_oss_loader_prepares_the_bytes_of_mxqs_cpp_reader(checkpoints):
    model = use_mxq_experts(_load("gpt-oss", checkpoints["gpt-oss"]))
    state = model.state_dict()  # the prepared tensors are buffers of each experts module
    for layer, experts in enumerate(_experts(model)):
        reference = Mxfp4MoE.from_checkpoint(str(checkpoints["gpt-oss"]), layer)
        for name in ("w13", "w13_scale", "w13_bias", "w2", "w2_scale", "w2_bias"):
            ours = getattr(experts.mxq, name)
            assert torch.equal(ours.view(torch.uint8), getattr(reference, name).view(torch.uint8))
            assert state[f"model.layers.{layer}.mlp.experts.mxq.{name}"].data_ptr() == \
                ours.data_ptr()
        assert experts.mxq.intermediate_size_per_partition_after_pad == 256  # I = 160, padded


@pytest.mark.parametrize("kind", ["gpt-oss", "deepseek-v4"])
def test_eager_reference_holds_the_dequantized_stored_weights(checkpoints, kind):
    """transformers' dequantization (the eager reference) gives exactly the values of the MXFP4
    bytes mxq reads: the two paths compute with the same weights."""
    model = _load(kind, checkpoints[kind])
    experts = _experts(model)[0]
    from safetensors.torch import load_file

    stored = load_file(str(checkpoints[kind] / "model.safetensors"))
    if kind == "gpt-oss":
        prefix = "model.layers.0.mlp.experts.gate_up_proj"
        blocks, scales = stored[prefix + "_blocks"], stored[prefix + "_scales"]
        weight = experts.gate_up_proj.transpose(1, 2)  # [E, 2I, H], interleaved rows
    else:
        blocks = torch.stack([torch.cat([stored[f"layers.0.ffn.experts.{e}.{w}.weight"]
                                         for w in ("w1", "w3")]) for e in range(8)])
        scales = torch.stack([torch.cat([stored[f"layers.0.ffn.experts.{e}.{w}.scale"]
                                         for w in ("w1", "w3")]) for e in range(8)])
        blocks = blocks.view(torch.uint8).reshape(*scales.shape, 16)
        weight = experts.gate_up_proj  # [E, 2I, H], gate rows then up rows
    values = torch.ops.mxq.dequantize_mxfp4(blocks, scales.view(torch.uint8))
    assert torch.equal(weight.float(), values)


# --- the forward against transformers' eager experts -------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["gpt-oss", "deepseek-v4"])
def test_logits_match_transformers_eager(checkpoints, kind, device):
    model = use_mxq_experts(_load(kind, checkpoints[kind], device), checkpoints[kind])
    ids = _ids(device, length=12, batch=2)
    eager, ours = _logits(model, ids, "eager"), _logits(model, ids, MXQ)
    assert ours.device.type == device
    assert ((ours - eager).norm() / eager.norm()).item() <= REL_TOL
    assert (ours - eager).abs().max().item() <= ABS_TOL
    # The experts matter: a model without them is far off (so the check above has teeth).
    assert not torch.allclose(ours, _logits_without_experts(model, ids), atol=0.1)


def _logits_without_experts(model, ids):
    class Zero(torch.nn.Module):
        def forward(self, hidden_states, *args, **kwargs):
            return torch.zeros_like(hidden_states)

    clone = copy.deepcopy(model)
    for name, _ in list(clone.named_modules()):
        if name.endswith("mlp.experts"):
            clone.set_submodule(name, Zero())
    with torch.no_grad():
        return clone(ids).logits.float()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["gpt-oss", "deepseek-v4"])
def test_greedy_generation_matches_transformers_eager(checkpoints, kind, device):
    model = use_mxq_experts(_load(kind, checkpoints[kind], device), checkpoints[kind])
    ids = _ids(device)
    runs = {}
    for implementation in ("eager", MXQ):
        model.set_experts_implementation(implementation)
        run = model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             do_sample=False, output_logits=True, return_dict_in_generate=True)
        runs[implementation] = (run.sequences[0, ids.shape[1]:], torch.stack(run.logits)[:, 0])
    (eager, eager_logits), (ours, our_logits) = runs["eager"], runs[MXQ]
    assert eager.numel() == ours.numel() == NEW_TOKENS
    top2 = eager_logits.float().topk(2).values
    near_tie = (top2[:, 0] - top2[:, 1]) < ABS_TOL
    assert near_tie.sum() <= 4, "too many near-ties: the comparison says little"
    # Identical tokens, except after a step where eager's top two are within the tolerance (a
    # tie either may break; the contexts differ from there on). Up to that step the logits of
    # every step agree within the tolerance.
    differ = (eager != ours).nonzero()
    same = NEW_TOKENS if differ.numel() == 0 else int(differ[0, 0])
    if same < NEW_TOKENS:
        assert near_tie[same], f"token {same} differs without a near-tie"
    steps = min(same + 1, NEW_TOKENS)
    assert (our_logits[:steps].float() - eager_logits[:steps].float()).abs().max() <= ABS_TOL


def test_the_forward_takes_the_routing_in_any_dtype_and_layout(checkpoints):
    from mxq.integrations.transformers import mxq_experts_forward

    model = use_mxq_experts(_load("gpt-oss", checkpoints["gpt-oss"]), checkpoints["gpt-oss"])
    experts = _experts(model)[0]
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(128, 10, generator=generator).t()  # [10, 128], not contiguous
    weights, ids = torch.randn(10, 8, generator=generator).softmax(-1).topk(2)  # int64 ids
    expected = mxq_experts_forward(experts, x.contiguous(), ids.int(), weights.float())
    got = mxq_experts_forward(experts, x, ids.t().contiguous().t(), weights.double())
    assert got.dtype == torch.float32 and torch.equal(got, expected)


def test_compiled_experts_fullgraph_match_eager_mxq(checkpoints):
    model = use_mxq_experts(_load("gpt-oss", checkpoints["gpt-oss"]), checkpoints["gpt-oss"])
    mlp = model.model.layers[1].mlp  # router (transformers) + experts (dispatched to mxq)
    compiled = torch.compile(mlp, fullgraph=True)  # inductor: one graph, mxq's op inside
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for shape in ((2, 5, 128), (3, 7, 128)):  # the second one recompiles (dynamic)
            x = torch.randn(shape, generator=generator)
            assert torch.equal(compiled(x)[0], mlp(x)[0])


@pytest.mark.cuda
def test_moe_block_replays_in_a_cuda_graph(checkpoints):
    """gpt-oss's MoE block (transformers' router, mxq's experts) captured in a CUDA graph replays
    what it computes eagerly, bit for bit, for new inputs copied into the captured buffer: the
    experts neither allocate outside torch's allocator, nor synchronize, nor copy weights."""
    model = use_mxq_experts(_load("gpt-oss", checkpoints["gpt-oss"], "cuda"),
                            checkpoints["gpt-oss"])
    mlp = model.model.layers[1].mlp
    generator = torch.Generator(device="cuda").manual_seed(6)
    static_x = torch.randn(1, 5, 128, device="cuda", generator=generator)
    with torch.no_grad():
        side = torch.cuda.Stream()  # warm-up off the capture stream, as torch's recipe has it
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                mlp(static_x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = mlp(static_x)[0]
        for _ in range(3):
            x = torch.randn(1, 5, 128, device="cuda", generator=generator)
            static_x.copy_(x)
            graph.replay()
            assert torch.equal(static_out, mlp(x)[0])


# --- W4A8 (activation_quant="fp8_g128") ----------------------------------------------------------

def _fp8_g128(x: "torch.Tensor") -> "torch.Tensor":
    """mxq's W4A8 activation rounding (docs/moe.md), written with torch: each row's groups of 128
    as E4M3 codes of x / scale (fp32, round to nearest even), scale = max(amax, 1e-4) / 448 in
    fp32, dequantized in float64."""
    rows, k = x.shape
    groups = torch.nn.functional.pad(x.float(), (0, (-k) % 128)).reshape(rows, -1, 128)
    scale = groups.abs().amax(-1, keepdim=True).clamp_min(1e-4) / 448
    codes = (groups / scale).to(torch.float8_e4m3fn).float()
    return (codes.double() * scale.double()).reshape(rows, -1)[:, :k]


def _gpt_oss_w4a8_emulation(experts, x, ids, weights):
    """gpt-oss's experts W4A8, independently of mxq: transformers' dequantized weights and its
    SwiGLU, in float64, with mxq's rounding points (x to bf16, then E4M3 groups; the SwiGLU
    output to bf16, then E4M3 groups; the output to bf16)."""
    xq = _fp8_g128(x.to(torch.bfloat16).float())
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate_up = xq[t] @ experts.gate_up_proj[e].double() + experts.gate_up_proj_bias[e].double()
            gate = gate_up[::2].clamp(max=experts.limit)
            up = gate_up[1::2].clamp(min=-experts.limit, max=experts.limit)
            act = (up + 1) * gate * torch.sigmoid(gate * experts.alpha)
            actq = _fp8_g128(act.to(torch.bfloat16).float()[None])[0]
            down = actq @ experts.down_proj[e].double() + experts.down_proj_bias[e].double()
            out[t] += float(weights[t, j]) * down
    return out.to(torch.bfloat16).float()


def test_w4a8_experts_match_an_independent_emulation(checkpoints):
    model = use_mxq_experts(_load("gpt-oss", checkpoints["gpt-oss"]), checkpoints["gpt-oss"],
                            activation_quant="fp8_g128")
    experts = _experts(model)[0]
    assert experts.mxq.activation_quant == "fp8_g128"
    from mxq.integrations.transformers import mxq_experts_forward

    generator = torch.Generator().manual_seed(6)
    x = torch.randn(9, 128, generator=generator)
    weights, ids = torch.randn(9, 8, generator=generator).softmax(-1).topk(2)
    ours = mxq_experts_forward(experts, x, ids, weights)
    expected = _gpt_oss_w4a8_emulation(experts, x, ids, weights)
    assert ((ours - expected).norm() / expected.norm()).item() <= 4e-3
    # The activations' quantization is what the comparison sees: the W4A16 experts are farther.
    w4a16 = use_mxq_experts(_load("gpt-oss", checkpoints["gpt-oss"]), checkpoints["gpt-oss"])
    bf16 = mxq_experts_forward(_experts(w4a16)[0], x, ids, weights)
    assert (bf16 - expected).norm() > 4 * (ours - expected).norm()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["gpt-oss", "deepseek-v4"])
def test_w4a8_generation_runs_near_the_w4a16_one(checkpoints, kind, device):
    w4a8 = use_mxq_experts(_load(kind, checkpoints[kind], device), checkpoints[kind],
                           activation_quant="fp8_g128")
    w4a16 = use_mxq_experts(_load(kind, checkpoints[kind], device), checkpoints[kind])
    ids = _ids(device, length=12, batch=2)
    ours, bf16 = _logits(w4a8, ids, MXQ), _logits(w4a16, ids, MXQ)
    assert torch.isfinite(ours).all() and not torch.equal(ours, bf16)
    # The quantization moves the logits by a fraction of what the experts contribute (measured on
    # these tiny models: 3% for gpt-oss, 13% for DeepSeek-V4), not as far as dropping them.
    without = _logits_without_experts(w4a16, ids)
    assert (ours - bf16).norm() < 0.25 * (without - bf16).norm()
    w4a8.set_experts_implementation(MXQ)
    run = w4a8.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert run.shape == (2, ids.shape[1] + 8)


def test_an_unknown_activation_quant_is_refused(checkpoints):
    model = _load("gpt-oss", checkpoints["gpt-oss"])
    snapshot = _snapshot(model)
    with pytest.raises(mxq.InvalidArgumentError,
                       match='activation_quant: expected "bf16" or "fp8_g128", found "fp4"'):
        use_mxq_experts(model, checkpoints["gpt-oss"], activation_quant="fp4")
    _assert_unchanged(model, snapshot)


# --- where the weights come from ---------------------------------------------------------------

@pytest.mark.parametrize("kind", ["gpt-oss", "deepseek-v4"])
def test_quantize_opt_in_requantizes_dequantized_weights_to_the_same_values(checkpoints, kind):
    stored = use_mxq_experts(_load(kind, checkpoints[kind]), checkpoints[kind])
    quantized = use_mxq_experts(_load(kind, checkpoints[kind]), quantize=True)
    ids = _ids("cpu", length=12)
    # MXFP4 values dequantized to float requantize to the same values (the bytes may differ:
    # a block's scale can move by a power of two with its codes).
    assert torch.equal(_logits(stored, ids, MXQ), _logits(quantized, ids, MXQ))


def test_default_checkpoint_is_the_directory_the_model_came_from(checkpoints):
    model = use_mxq_experts(_load("gpt-oss", checkpoints["gpt-oss"]))  # config._name_or_path
    reference = use_mxq_experts(_load("gpt-oss", checkpoints["gpt-oss"]),
                                checkpoints["gpt-oss"])
    for ours, theirs in zip(_experts(model), _experts(reference)):
        assert torch.equal(ours.mxq.w13, theirs.mxq.w13)


def test_deepseek_v4_fp4_experts_kept_by_transformers_are_read_as_stored(checkpoints):
    """DeepSeek-V4 loaded with its FP8 quantizer keeps the experts as stored (FP8Experts, int8
    weights, E8M0 scales); mxq prepares those without the files, the same bytes as from them.
    On the CPU transformers dequantizes, so the test builds that module itself."""
    fp8 = pytest.importorskip("transformers.integrations.finegrained_fp8")
    import inspect

    from transformers.integrations.moe import use_experts_implementation

    path = checkpoints["deepseek-v4"]
    from_files = use_mxq_experts(_load("deepseek-v4", path), path)
    model = _load("deepseek-v4", path)
    config = model.config
    config.expert_dtype = "fp4"  # transformers 5.17 reads it here, later versions as a kwarg
    kwargs = {"scale_fmt": "ue8m0"}
    if "expert_dtype" in inspect.signature(fp8.FP8Experts.__init__).parameters:
        kwargs["expert_dtype"] = "fp4"
    cls = use_experts_implementation(experts_class=fp8.FP8Experts,
                                     experts_interface=fp8.ALL_FP8_EXPERTS_FUNCTIONS)
    for layer, reference in enumerate(_experts(from_files)):
        module = cls(config, **kwargs)
        module.limit = model.model.layers[layer].mlp.experts.limit
        from safetensors.torch import load_file

        stored = load_file(str(path / "model.safetensors"))
        for proj, ws in (("gate_up_proj", ("w1", "w3")), ("down_proj", ("w2",))):
            for suffix, target in ((".weight", proj), (".scale", proj + "_scale_inv")):
                value = torch.stack([torch.cat([stored[f"layers.{layer}.ffn.experts.{e}.{w}"
                                                       f"{suffix}"] for w in ws])
                                     for e in range(config.n_routed_experts)])
                getattr(module, target).data = value
        model.model.layers[layer].mlp.experts = module
    use_mxq_experts(model)  # no checkpoint: the module's own int8 bytes
    for ours, theirs in zip(_experts(model), _experts(from_files)):
        assert type(ours).__name__ == "FP8Experts"
        for name in ("w13", "w13_scale", "w2", "w2_scale"):
            assert torch.equal(getattr(ours.mxq, name), getattr(theirs.mxq, name))
    ids = _ids("cpu", length=12)
    assert torch.equal(_logits(model, ids, MXQ), _logits(from_files, ids, MXQ))


@pytest.mark.cuda
def test_deepseek_v4_fp8_quantized_on_cuda_runs_its_fp4_experts_through_mxq(checkpoints):
    path = checkpoints["deepseek-v4"]
    _needs_accelerate("deepseek-v4")
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    model = model.to("cuda").eval()
    if type(_experts(model)[0]).__name__ != "FP8Experts":
        pytest.skip("transformers dequantized this FP8 checkpoint (no FP8-capable GPU)")
    use_mxq_experts(model)  # from the int8 experts transformers loaded as stored
    reference = use_mxq_experts(_load("deepseek-v4", path, "cuda"), path)
    # The experts alone (the rest of this model runs transformers' FP8 kernels, not mxq's).
    x = torch.randn(6, 128, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 8, (6, 2), device="cuda")
    weights = torch.rand(6, 2, device="cuda")
    from mxq.integrations.transformers import mxq_experts_forward

    for ours, theirs in zip(_experts(model), _experts(reference)):
        for name in ("w13", "w13_scale", "w2", "w2_scale"):
            assert torch.equal(getattr(ours.mxq, name), getattr(theirs.mxq, name))
        torch.testing.assert_close(mxq_experts_forward(ours, x, ids, weights),
                                   mxq_experts_forward(theirs, x, ids, weights))


# --- errors leave the model as it was -----------------------------------------------------------

def _snapshot(model):
    return ([(name, type(m)) for name, m in model.named_modules()],
            {k: v.clone() for k, v in model.state_dict().items()},
            model.config._experts_implementation)


def _assert_unchanged(model, snapshot):
    modules, state, implementation = _snapshot(model)
    assert modules == snapshot[0]
    assert state.keys() == snapshot[1].keys()
    assert all(torch.equal(state[k], v) for k, v in snapshot[1].items())
    assert implementation == snapshot[2]


def _tiny(config_class_name: str, **kwargs):
    config = getattr(transformers, config_class_name)(
        vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, **kwargs)
    return transformers.AutoModelForCausalLM.from_config(config)


def test_a_model_without_experts_is_refused():
    model = _tiny("LlamaConfig")
    snapshot = _snapshot(model)
    with pytest.raises(mxq.Error, match="no routed-experts module") as error:
        use_mxq_experts(model, quantize=True)
    assert error.value.code == "unsupported"
    _assert_unchanged(model, snapshot)


def test_experts_mxq_does_not_serve_are_refused():
    model = _tiny("Qwen3MoeConfig", moe_intermediate_size=64, num_experts=4,
                  num_experts_per_tok=2)
    snapshot = _snapshot(model)
    with pytest.raises(mxq.Error, match="Qwen3MoeExperts is not an experts module mxq serves"):
        use_mxq_experts(model, quantize=True)
    _assert_unchanged(model, snapshot)


def test_a_quantization_mxq_cannot_serve_is_refused(checkpoints):
    model = _load("gpt-oss", checkpoints["gpt-oss"])
    model.config.quantization_config = {"quant_method": "awq", "bits": 4}
    snapshot = _snapshot(model)
    with pytest.raises(mxq.Error, match="quant_method='awq'.*mxq serves MXFP4 experts"):
        use_mxq_experts(model, checkpoints["gpt-oss"])
    _assert_unchanged(model, snapshot)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_cuda_without_cuda_is_refused(checkpoints):
    model = _load("gpt-oss", checkpoints["gpt-oss"])
    snapshot = _snapshot(model)
    with pytest.raises(mxq.Error, match="CUDA asked, but torch sees no CUDA device"):
        use_mxq_experts(model, checkpoints["gpt-oss"], device="cuda")
    _assert_unchanged(model, snapshot)


@pytest.mark.cuda
def test_a_device_other_than_the_models_is_refused(checkpoints):
    model = _load("gpt-oss", checkpoints["gpt-oss"])  # on the CPU
    snapshot = _snapshot(model)
    with pytest.raises(mxq.InvalidArgumentError, match="but the experts are on cpu"):
        use_mxq_experts(model, checkpoints["gpt-oss"], device="cuda")
    _assert_unchanged(model, snapshot)


def test_dequantized_weights_without_a_checkpoint_are_refused_not_requantized(checkpoints):
    model = _load("gpt-oss", checkpoints["gpt-oss"])
    model.config._name_or_path = ""  # as if built in memory
    snapshot = _snapshot(model)
    with pytest.raises(mxq.Error, match="MXFP4 weights as stored.*quantize=True"):
        use_mxq_experts(model)
    _assert_unchanged(model, snapshot)


def test_a_tensor_missing_from_the_checkpoint_changes_nothing(checkpoints, tmp_path):
    """Layer 0 prepares, layer 1 fails: no layer is changed (all are prepared first)."""
    from safetensors.torch import load_file, save_file

    source = checkpoints["gpt-oss"]
    tensors = load_file(str(source / "model.safetensors"))
    del tensors["model.layers.1.mlp.experts.down_proj_scales"]
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((source / "config.json").read_text())
    model = _load("gpt-oss", source)
    snapshot = _snapshot(model)
    with pytest.raises(mxq.Error, match="no tensor model.layers.1.mlp.experts.down_proj_scales"):
        use_mxq_experts(model, tmp_path)
    _assert_unchanged(model, snapshot)


# --- docs/transformers.md -----------------------------------------------------------------------

def test_doc_example_runs():
    text = (Path(__file__).resolve().parents[2] / "docs" / "transformers.md").read_text()
    text = text.split("## DeepSeek-V3 block-FP8 linears")[0]  # the MoE half's sections
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks
    for index, code in enumerate(blocks):
        exec(compile(code, f"transformers.md[{index}]", "exec"), {"__name__": "__doc__"})


# --- the synthesizer's command line -------------------------------------------------------------

def test_synth_command_line_writes_a_checkpoint(tmp_path, capsys):
    # main() is what `python -m mxq.integrations.transformers.synth` runs (in-process here:
    # a fresh interpreter would spend seconds importing torch and transformers).
    with pytest.raises(SystemExit) as exit_:
        synth.main(["--help"])
    assert exit_.value.code == 0 and "deepseek-v4" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        synth.main(["gpt-oss", str(tmp_path / "c"), "--hidden", "100"])
    assert exit_.value.code == 2 and "--hidden: expected a positive multiple of 32" in \
        capsys.readouterr().err
    assert synth.main(["gpt-oss", str(tmp_path / "c"), "--layers", "1", "--experts", "4",
                       "--intermediate", "96"]) == 0
    config = transformers.AutoConfig.from_pretrained(tmp_path / "c")
    assert (config.model_type, config.num_hidden_layers, config.num_local_experts,
            config.intermediate_size) == ("gpt_oss", 1, 4, 96)
    assert config.quantization_config["quant_method"] == "mxfp4"
