"""The engine-facing MXFP4 MoE ops (torch.ops.mxq.mxfp4_moe_prepare / mxfp4_moe / moe_route) and
the Mxfp4MoE module, on the CPU (the CUDA paths: tests/python/test_cuda.py): one rank per call,
the ranks' partials summing to the layer simulated in one process; prepared buffers in
state_dict and across .to(); fake implementations, opcheck and torch.compile."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mxq  # noqa: E402
import mxq.torch_ops as ops  # noqa: E402

E, H, I, TOP_K = 8, 128, 96, 2


def experts_of(checkpoint: Path, layer: int = 0) -> dict:
    from safetensors.torch import load_file

    tensors = {}
    for f in sorted(checkpoint.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    p = f"model.layers.{layer}.mlp."
    return {
        "w13": tensors[p + "experts.gate_up_proj_blocks"],
        "w13_scale": tensors[p + "experts.gate_up_proj_scales"],
        "w13_bias": tensors[p + "experts.gate_up_proj_bias"],
        "w2": tensors[p + "experts.down_proj_blocks"],
        "w2_scale": tensors[p + "experts.down_proj_scales"],
        "w2_bias": tensors[p + "experts.down_proj_bias"],
        "router_weight": tensors[p + "router.weight"],
        "router_bias": tensors[p + "router.bias"],
    }


def module_of(ex: dict, **kwargs) -> "ops.Mxfp4MoE":
    return ops.Mxfp4MoE.from_experts(
        ex["w13"], ex["w13_scale"], ex["w13_bias"], ex["w2"], ex["w2_scale"], ex["w2_bias"],
        num_experts=E, intermediate_size=I, top_k=TOP_K, layout="gpt-oss",
        router_weight=ex["router_weight"], router_bias=ex["router_bias"], **kwargs)


def test_one_rank_equals_the_layer_and_ranks_sum_to_it(moe_checkpoint):
    ex = experts_of(moe_checkpoint)
    x = torch.randn(7, H, generator=torch.Generator().manual_seed(1)).bfloat16()
    whole = mxq.MoELayer.from_checkpoint(moe_checkpoint, layer=0, align=128)
    want = whole.forward(x.float().numpy())
    got = module_of(ex)(x)
    assert got.dtype == torch.bfloat16
    np.testing.assert_array_equal(got.float().numpy(), want)
    # TP = 2 x EP = 2, one call per rank (as one process per rank would), summed in rank order.
    split = mxq.MoELayer.from_checkpoint(moe_checkpoint, layer=0, tp_size=2, ep_size=2, align=128)
    result = split._core.forward(x.float().numpy(), None, None, None)
    total = torch.zeros(7, H)
    for ep in range(2):
        for tp in range(2):
            part = module_of(ex, tp_rank=tp, tp_size=2, ep_rank=ep, ep_size=2,
                             out_dtype=torch.float32)(x)
            assert part.dtype == torch.float32
            total += part
    np.testing.assert_array_equal(total.numpy(), result["accumulator"])


def test_engine_routing_and_the_router_op(moe_checkpoint):
    ex = experts_of(moe_checkpoint)
    module = module_of(ex)
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(2)).bfloat16()
    ids, weights = torch.ops.mxq.moe_route(x, ex["router_weight"], ex["router_bias"], TOP_K)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert ids.shape == weights.shape == (5, TOP_K)
    routed = module(x)
    given = module(x, ids, weights)
    assert torch.equal(routed, given)
    other = module(x, (ids + 1) % E, weights)
    assert not torch.equal(other, given)
    with pytest.raises(mxq.InvalidArgumentError, match="topk_ids: expected"):
        module(x, ids[:, :1].contiguous(), weights[:, :1].contiguous())


def test_prepared_buffers_are_the_modules_state(moe_checkpoint, tmp_path):
    ex = experts_of(moe_checkpoint)
    module = module_of(ex, tp_rank=1, tp_size=2)
    assert module.intermediate_size_per_partition == 64
    assert module.intermediate_size_per_partition_after_pad == 128
    state = module.state_dict()
    assert set(state) == {"w13", "w13_scale", "w13_bias", "w2", "w2_scale", "w2_bias",
                          "router_weight", "router_bias"}
    assert state["w13"].shape == (E, 2 * 128, H // 2)
    torch.save(state, tmp_path / "rank.pt")
    fresh = ops.Mxfp4MoE(E, H, I, TOP_K, tp_rank=1, tp_size=2)
    fresh.load_state_dict(torch.load(tmp_path / "rank.pt"))
    x = torch.randn(3, H).bfloat16()
    assert torch.equal(fresh(x), module(x))
    # The functional op gives the same prepared bytes as the module.
    prepared = torch.ops.mxq.mxfp4_moe_prepare(
        ex["w13"], ex["w13_scale"], ex["w13_bias"], ex["w2"], ex["w2_scale"], ex["w2_bias"],
        E, I, 1, 2, layout="gpt-oss")
    for name, t in zip(("w13", "w13_scale", "w13_bias", "w2", "w2_scale", "w2_bias"), prepared):
        assert torch.equal(t, state[name]), name


def test_dtype_conversions_of_a_model_keep_the_prepared_dtypes(moe_checkpoint):
    module = module_of(experts_of(moe_checkpoint))
    x = torch.randn(3, H).bfloat16()
    expected = module(x)
    parent = torch.nn.Sequential(module).float().half().to(torch.float64)
    assert module.w13_bias.dtype == module.router_weight.dtype == torch.bfloat16
    assert module.w13.dtype == torch.uint8
    assert torch.equal(parent[0](x), expected)


def test_a_weight_update_rewrites_the_same_storage(moe_checkpoint):
    first, second = experts_of(moe_checkpoint, 0), experts_of(moe_checkpoint, 1)
    module = module_of(first)
    address = module.w13.data_ptr()
    x = torch.randn(4, H).bfloat16()
    before = module(x)
    module.load_experts(*(second[k] for k in ("w13", "w13_scale", "w13_bias", "w2", "w2_scale",
                                              "w2_bias")), layout="gpt-oss")
    assert module.w13.data_ptr() == address
    assert not torch.equal(module(x), before)
    module.load_experts(*(first[k] for k in ("w13", "w13_scale", "w13_bias", "w2", "w2_scale",
                                             "w2_bias")), layout="gpt-oss")
    assert torch.equal(module(x), before)  # bit-identical to the first preparation


def test_opcheck_and_compile(moe_checkpoint):
    ex = experts_of(moe_checkpoint)
    module = module_of(ex)
    x = torch.randn(6, H).bfloat16()
    args = (x, module.w13, module.w13_scale, module.w13_bias, module.w2, module.w2_scale,
            module.w2_bias, None, None, module.router_weight, module.router_bias, E, I, TOP_K)
    torch.library.opcheck(torch.ops.mxq.mxfp4_moe.default, args)
    out = torch.empty(6, H, dtype=torch.float32)
    into = (x, module.w13, module.w13_scale, module.w13_bias, module.w2, module.w2_scale,
            module.w2_bias, None, None, module.router_weight, module.router_bias, out,
            torch.empty(0, dtype=torch.uint8), E, I, TOP_K, 6)
    torch.library.opcheck(torch.ops.mxq.mxfp4_moe_into.default, into)
    torch.ops.mxq.mxfp4_moe_into(*into)
    assert torch.equal(out.bfloat16(), module(x))  # the same partial, rounded once
    torch.library.opcheck(torch.ops.mxq.moe_route.default,
                          (x, ex["router_weight"], ex["router_bias"], TOP_K))
    compiled = torch.compile(module, fullgraph=True, dynamic=True)
    assert torch.equal(compiled(x), module(x))
    y = torch.randn(9, H).bfloat16()
    assert torch.equal(compiled(y), module(y))


def test_bad_arguments_are_refused_by_name(moe_checkpoint):
    ex = experts_of(moe_checkpoint)
    module = module_of(ex)
    with pytest.raises(mxq.DtypeError, match="x: expected"):
        module(torch.randn(2, H, dtype=torch.float16))
    with pytest.raises(mxq.InvalidArgumentError, match="routing: give either"):
        torch.ops.mxq.mxfp4_moe(torch.randn(2, H).bfloat16(), module.w13, module.w13_scale,
                                module.w13_bias, module.w2, module.w2_scale, module.w2_bias,
                                None, None, None, None, E, I, TOP_K)
    with pytest.raises(ValueError, match="x: expected"):
        module(torch.randn(2, H + 32).bfloat16())
    with pytest.raises(ValueError, match="experts.w13: expected"):
        torch.ops.mxq.mxfp4_moe_prepare(ex["w13"][:3], ex["w13_scale"][:3], ex["w13_bias"][:3],
                                        ex["w2"][:3], ex["w2_scale"][:3], ex["w2_bias"][:3], E, I,
                                        layout="gpt-oss")
