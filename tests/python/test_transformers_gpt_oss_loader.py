"""load_gpt_oss (mxq.integrations.transformers): a gpt-oss checkpoint with mxq's MXFP4 experts
only. It gives the same model as from_pretrained + use_mxq_experts, bit for bit, without the
experts' floating weights, and refuses what it cannot load with the model's reason."""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import mxq  # noqa: E402
from mxq.integrations.transformers import load_gpt_oss, synth, use_mxq_experts  # noqa: E402
from mxq.torch_ops import Mxfp4MoE  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    # Intermediate size 160 (padded to 256 by mxq); a SwiGLU limit the random model reaches.
    return synth.write_gpt_oss(tmp_path_factory.mktemp("gpt-oss") / "ckpt", seed=4,
                               swiglu_limit=1.0)


def _ids(device):
    return torch.randint(0, 250, (2, 8), generator=torch.Generator().manual_seed(5)).to(device)


def _bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


@pytest.mark.parametrize("device", DEVICES)
def test_the_same_model_as_from_pretrained_without_the_floating_experts(checkpoint, device):
    model = load_gpt_oss(checkpoint, device=device)
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        checkpoint, dtype=torch.bfloat16, experts_implementation="mxq",
        quantization_config=transformers.Mxfp4Config(dequantize=True)).to(device).eval()
    use_mxq_experts(reference, checkpoint)
    for m in (model, reference):
        m.generation_config.eos_token_id = None
    ids = _ids(device)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
        assert torch.equal(model.generate(ids, max_new_tokens=8, do_sample=False),
                           reference.generate(ids, max_new_tokens=8, do_sample=False))
    assert not model.training
    # Each experts module holds mxq's prepared tensors and no floating weights of its own.
    for layer in model.model.layers:
        experts = layer.mlp.experts
        assert isinstance(experts.mxq, Mxfp4MoE)
        assert list(experts.parameters(recurse=False)) == []
        assert all(t.device.type == torch.device(device).type for t in experts.mxq.buffers())
    assert not any(".experts.gate_up_proj" in k or ".experts.down_proj" in k
                   for k in model.state_dict())
    assert _bytes(model) < _bytes(reference) / 2  # the bf16 experts were most of it


def _copy_with_config(checkpoint, tmp_path, edit):
    target = tmp_path / "edited"
    shutil.copytree(checkpoint, target)
    config = json.loads((target / "config.json").read_text())
    edit(config)
    (target / "config.json").write_text(json.dumps(config))
    return target


def test_other_models_and_quantizations_are_refused(checkpoint, tmp_path):
    llama = _copy_with_config(checkpoint, tmp_path, lambda c: c.update(model_type="llama"))
    with pytest.raises(mxq.Error, match="model_type 'llama'") as error:
        load_gpt_oss(llama)
    assert error.value.code == "unsupported"
    shutil.rmtree(llama)
    bf16 = _copy_with_config(checkpoint, tmp_path, lambda c: c.pop("quantization_config"))
    with pytest.raises(mxq.Error, match="quant_method None") as error:
        load_gpt_oss(bf16)
    assert error.value.code == "unsupported"


def test_a_missing_tensor_is_named(checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file

    target = tmp_path / "missing"
    shutil.copytree(checkpoint, target)
    tensors = load_file(str(target / "model.safetensors"))
    del tensors["model.layers.1.self_attn.q_proj.weight"]
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(mxq.Error, match="model.layers.1.self_attn.q_proj.weight") as error:
        load_gpt_oss(target)
    assert error.value.code == "format"
    del tensors["model.layers.0.mlp.experts.down_proj_scales"]
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(mxq.Error, match="down_proj_scales"):
        load_gpt_oss(target)


def test_cuda_without_cuda_is_refused(checkpoint):
    if torch.cuda.is_available() and mxq.with_cuda:
        pytest.skip("this machine has CUDA")
    with pytest.raises(mxq.Error, match="CUDA asked") as error:
        load_gpt_oss(checkpoint, device="cuda")
    assert error.value.code == "unsupported"
