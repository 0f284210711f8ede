"""mxq's MXFP4 MoE as the "mxq" experts implementation of Hugging Face transformers.

transformers runs a model's routed experts through ``ALL_EXPERTS_FUNCTIONS[
config._experts_implementation]`` (``@use_experts_implementation``); mxq registers "mxq" there
(and in the FP8 experts interface, which DeepSeek-V4's FP4 experts use when transformers keeps
them quantized). The registered forward takes the model's own ``top_k_index`` /
``top_k_weights``, so routing stays transformers', and runs ``torch.ops.mxq.mxfp4_moe`` on the
prepared tensors that :func:`use_mxq_experts` put into each experts module (an ``Mxfp4MoE``
child named ``mxq``: its buffers are the module's, so ``state_dict`` and ``.to()`` see them).

The weights are the checkpoint's MXFP4 bytes as stored, never a round trip through bf16:

* gpt-oss: ``*.experts.gate_up_proj_blocks`` / ``_scales`` / ``_bias`` and ``down_proj_*``,
  read from the checkpoint's safetensors files (transformers dequantizes them to bf16 unless its
  own MXFP4 kernels are installed, so they are read again here);
* DeepSeek-V4: ``layers.L.ffn.experts.e.w1`` / ``w3`` / ``w2`` ``.weight`` (int8, two E2M1 per
  byte) and ``.scale`` (E8M0 per 32), from the files, or from the experts module itself when
  transformers' FP8 quantizer kept them as stored (its ``FP8Experts`` with int8 weights).

Quantizing bf16 expert weights is an explicit opt-in (``quantize=True``), not lossless in
general. Everything is checked before anything is changed: an error leaves the model as it was.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch
from torch import Tensor

from ... import _mxq
from ..._errors import Error, InvalidArgumentError
from ...torch_ops import Mxfp4MoE

__all__ = ["MXQ", "mxq_experts_forward", "register", "use_mxq_experts"]

MXQ = "mxq"  # the experts_implementation name
MIN_TRANSFORMERS = (5, 17)
_CHILD = "mxq"  # the Mxfp4MoE child of an experts module


def _unsupported(message: str) -> Error:
    return Error(message, "unsupported")


def _import_transformers():
    try:
        import transformers
    except ImportError as error:
        raise ImportError("mxq.integrations.transformers needs Hugging Face transformers >= "
                          f"{'.'.join(map(str, MIN_TRANSFORMERS))} (pip install transformers)"
                          ) from error
    return transformers


# --- the forward ----------------------------------------------------------------------------

def mxq_experts_forward(self: torch.nn.Module, hidden_states: Tensor, top_k_index: Tensor,
                        top_k_weights: Tensor) -> Tensor:
    """The experts forward transformers dispatches to for ``experts_implementation="mxq"``:
    hidden_states [T, H], the model's routing (expert ids [T, k], weights [T, k]); returns
    [T, H] in hidden_states' dtype."""
    moe = getattr(self, _CHILD, None)
    if not isinstance(moe, Mxfp4MoE):
        raise _unsupported(
            f"{type(self).__name__} runs with experts_implementation=\"mxq\" but holds no mxq "
            "weights: call mxq.integrations.transformers.use_mxq_experts(model, checkpoint) "
            "after loading (docs/transformers.md)")
    shape = hidden_states.shape
    # mxq computes in bf16 activations (on the CPU too, so CPU and CUDA agree) and accumulates
    # in fp32; ids and weights go in the op's dtypes, every input contiguous as the op wants.
    x = hidden_states.reshape(-1, shape[-1]).to(torch.bfloat16).contiguous()
    ids = top_k_index.reshape(x.shape[0], -1).to(torch.int32).contiguous()
    weights = top_k_weights.reshape(x.shape[0], -1).to(torch.float32).contiguous()
    return moe(x, ids, weights).to(hidden_states.dtype).reshape(shape)


def register() -> None:
    """Registers "mxq" with transformers' experts interfaces (idempotent); importing
    ``mxq.integrations.transformers`` does it."""
    transformers = _import_transformers()
    version = tuple(int(p) for p in re.findall(r"\d+", transformers.__version__)[:2])
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError as error:
        raise ImportError(f"transformers {transformers.__version__} has no experts interface "
                          "(transformers.integrations.moe.ALL_EXPERTS_FUNCTIONS, transformers >= "
                          f"{'.'.join(map(str, MIN_TRANSFORMERS))}): mxq cannot register its "
                          "experts implementation") from error
    if version < MIN_TRANSFORMERS:
        raise ImportError(f"mxq.integrations.transformers needs transformers >= "
                          f"{'.'.join(map(str, MIN_TRANSFORMERS))}, found "
                          f"{transformers.__version__}")
    ALL_EXPERTS_FUNCTIONS.register(MXQ, mxq_experts_forward)
    try:  # DeepSeek-V4's FP4 experts kept quantized by the FP8 quantizer dispatch through this
        from transformers.integrations.finegrained_fp8 import ALL_FP8_EXPERTS_FUNCTIONS
    except ImportError:
        return
    ALL_FP8_EXPERTS_FUNCTIONS.register(MXQ, mxq_experts_forward)


# --- what each experts class is --------------------------------------------------------------

@dataclass(frozen=True)
class ExpertsSpec:
    """What mxq needs of one experts module."""

    family: str  # "gpt-oss" or "deepseek-v4"
    num_experts: int
    hidden_size: int
    intermediate_size: int
    has_bias: bool
    activation: str
    swiglu_alpha: float
    swiglu_limit: float
    source: str  # "bf16" (the module's floating weights) or "fp4" (int8 E2M1 as stored)


def _experts_classes() -> Dict[str, Any]:
    """The experts classes mxq serves, by exact class (a subclass may change the math)."""
    classes: Dict[str, Any] = {}
    for key, module, name in (("gpt-oss", "transformers.models.gpt_oss.modeling_gpt_oss",
                               "GptOssExperts"),
                              ("deepseek-v4", "transformers.models.deepseek_v4."
                               "modeling_deepseek_v4", "DeepseekV4Experts"),
                              ("fp8", "transformers.integrations.finegrained_fp8", "FP8Experts"),
                              ("mxfp4", "transformers.integrations.mxfp4", "Mxfp4GptOssExperts")):
        try:
            classes[key] = getattr(__import__(module, fromlist=[name]), name)
        except (ImportError, AttributeError):
            pass
    return classes


def _spec(name: str, module: torch.nn.Module, model_type: str,
          classes: Dict[str, Any]) -> ExpertsSpec:
    kind = type(module)
    config = getattr(module, "config", None)
    if kind is classes.get("gpt-oss"):
        return ExpertsSpec("gpt-oss", module.num_experts, module.hidden_size,
                           module.intermediate_size, True, "swiglu_oai",
                           float(getattr(module, "alpha", 1.702)),
                           float(getattr(module, "limit", 7.0)), "bf16")
    if kind is classes.get("deepseek-v4"):
        return _deepseek_v4_spec(name, module, config, "bf16")
    if kind is classes.get("fp8") and model_type == "deepseek_v4":
        weight = getattr(module, "gate_up_proj", None)
        if weight is None or weight.dtype != torch.int8:
            raise _unsupported(
                f"{name}: FP8Experts with {getattr(weight, 'dtype', None)} weights (FP8 E4M3 "
                "experts): mxq serves MXFP4 experts only (DeepSeek-V4's expert_dtype \"fp4\")")
        if getattr(module, "swiglu_alpha", None) is not None or module.has_bias:
            raise _unsupported(f"{name}: FP8Experts with swiglu_alpha or biases is not "
                               "DeepSeek-V4's expert math; mxq does not serve it")
        return _deepseek_v4_spec(name, module, config, "fp4")
    if kind is classes.get("mxfp4"):
        raise _unsupported(
            f"{name}: transformers' own MXFP4 experts (Mxfp4GptOssExperts: its Triton kernels "
            "swizzle the weights). Load with quantization_config=Mxfp4Config(dequantize=True) "
            "and let mxq read the MXFP4 weights as stored from the checkpoint "
            "(use_mxq_experts(model, checkpoint))")
    raise _unsupported(f"{name}: {kind.__name__} is not an experts module mxq serves (gpt-oss's "
                       "GptOssExperts, DeepSeek-V4's DeepseekV4Experts or its FP4 FP8Experts)")


def _deepseek_v4_spec(name: str, module: torch.nn.Module, config: Any,
                      source: str) -> ExpertsSpec:
    act = getattr(config, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise _unsupported(f"{name}: hidden_act {act!r}: mxq's DeepSeek-V4 experts use SiLU")
    limit = getattr(module, "limit", None)  # silu(min(g, L)) * clamp(u, -L, L); none: plain
    return ExpertsSpec("deepseek-v4", module.num_experts, module.hidden_dim,
                       module.intermediate_dim, False,
                       "swiglu" if limit is None else "swiglu_clamp", 1.702,
                       7.0 if limit is None else float(limit), source)


def _find_experts(model: torch.nn.Module) -> Dict[str, torch.nn.Module]:
    # transformers names every routed-experts class *Experts (a shared expert is an *MLP).
    return {name: m for name, m in model.named_modules() if type(m).__name__.endswith("Experts")}


def _check_quantization(model: torch.nn.Module) -> None:
    config = getattr(model, "config", None)
    quant = getattr(config, "quantization_config", None)
    if quant is None:
        return
    get = quant.get if isinstance(quant, dict) else (lambda k, d=None: getattr(quant, k, d))
    method = get("quant_method")
    method = str(getattr(method, "value", method))
    expert_dtype = get("expert_dtype") or getattr(config, "expert_dtype", None)
    if method == "mxfp4":
        return
    if method == "fp8" and getattr(config, "model_type", None) == "deepseek_v4" and \
            expert_dtype == "fp4":
        return
    raise _unsupported(
        f"quantization_config quant_method={method!r}"
        + (f", expert_dtype={expert_dtype!r}" if expert_dtype else "")
        + ": mxq serves MXFP4 experts (gpt-oss's quant_method \"mxfp4\", DeepSeek-V4's "
        "quant_method \"fp8\" with expert_dtype \"fp4\")")


# --- reading the checkpoint as stored ----------------------------------------------------------

class _Checkpoint:
    """The tensors of a safetensors checkpoint (a directory, with or without an index, or one
    .safetensors file), read by name with the safetensors package."""

    def __init__(self, path: Union[str, os.PathLike]) -> None:
        try:
            from safetensors import safe_open
        except ImportError as error:
            raise ImportError("reading a checkpoint needs the safetensors package "
                              "(pip install safetensors)") from error
        self.path = Path(path)
        if self.path.is_dir():
            index = self.path / "model.safetensors.index.json"
            if index.is_file():
                files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            else:
                files = sorted(p.name for p in self.path.glob("*.safetensors"))
            files = [self.path / f for f in files]
        elif self.path.is_file():
            files = [self.path]
        else:
            raise Error(f"checkpoint {self.path}: no such file or directory", "io")
        if not files:
            raise Error(f"checkpoint {self.path}: no .safetensors files", "io")
        # One open (memory-mapped) handle per file: a DeepSeek-V4 layer is 6 tensors per expert.
        self._handles = {file: safe_open(str(file), framework="pt") for file in files}
        self._where = {key: file for file, handle in self._handles.items()
                       for key in handle.keys()}

    def names(self) -> Tuple[str, ...]:
        """Every tensor name of the checkpoint."""
        return tuple(self._where)

    def find(self, *names: str) -> Optional[str]:
        return next((n for n in names if n in self._where), None)

    def get(self, *names: str) -> Tensor:
        """The first of ``names`` the checkpoint holds (spellings with and without the base
        model's prefix)."""
        name = self.find(*names)
        if name is None:
            raise Error(f"checkpoint {self.path}: no tensor {names[0]}", "format")
        return self._handles[self._where[name]].get_tensor(name)


def _spellings(name: str) -> Tuple[str, ...]:
    return (name, name[len("model."):]) if name.startswith("model.") else (name, "model." + name)


def _expect(t: Tensor, label: str, shape: Tuple[int, ...], dtypes: Tuple[torch.dtype, ...]) -> None:
    if tuple(t.shape) != shape or t.dtype not in dtypes:
        raise Error(f"{label}: expected {list(shape)} {'/'.join(str(d) for d in dtypes)}, found "
                    f"{list(t.shape)} {t.dtype}", "format")


_SCALE_DTYPES = tuple(d for d in (torch.uint8, getattr(torch, "float8_e8m0fnu", None)) if d)


def _as_u8(t: Tensor) -> Tensor:
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def _gpt_oss_from_checkpoint(ckpt: _Checkpoint, name: str, s: ExpertsSpec) -> Tuple[Any, ...]:
    E, H, I = s.num_experts, s.hidden_size, s.intermediate_size
    out = []
    for proj, rows, k in (("gate_up_proj", 2 * I, H), ("down_proj", H, I)):
        blocks = ckpt.get(*_spellings(f"{name}.{proj}_blocks"))
        scales = ckpt.get(*_spellings(f"{name}.{proj}_scales"))
        bias = ckpt.get(*_spellings(f"{name}.{proj}_bias"))
        _expect(blocks, f"{name}.{proj}_blocks", (E, rows, k // 32, 16), (torch.uint8,))
        _expect(scales, f"{name}.{proj}_scales", (E, rows, k // 32), _SCALE_DTYPES)
        _expect(bias, f"{name}.{proj}_bias", (E, rows), (torch.bfloat16, torch.float32))
        out += [blocks, _as_u8(scales), bias.to(torch.bfloat16)]
    return (*out, "gpt-oss")


def _v4_layer(name: str) -> int:
    match = re.search(r"layers\.(\d+)\.mlp\.experts$", name)
    if match is None:
        raise _unsupported(f"{name}: not a DeepSeek-V4 layers.L.mlp.experts module name; mxq "
                           "cannot find its checkpoint tensors")
    return int(match.group(1))


def _v4_from_checkpoint(ckpt: _Checkpoint, name: str, s: ExpertsSpec) -> Tuple[Any, ...]:
    E, H, I, layer = s.num_experts, s.hidden_size, s.intermediate_size, _v4_layer(name)

    def read(expert: int, w: str, rows: int, k: int) -> Tuple[Tensor, Tensor]:
        stem = f"layers.{layer}.ffn.experts.{expert}.{w}"
        weight = ckpt.get(*_spellings(stem + ".weight"))
        scale = ckpt.get(*_spellings(stem + ".scale"))
        _expect(weight, stem + ".weight", (rows, k // 2), (torch.int8, torch.uint8))
        _expect(scale, stem + ".scale", (rows, k // 32), _SCALE_DTYPES)
        return _as_u8(weight), _as_u8(scale)

    w13, w13_scale, w2, w2_scale = [], [], [], []
    for e in range(E):
        (g, gs), (u, us), (d, ds) = (read(e, "w1", I, H), read(e, "w3", I, H),
                                     read(e, "w2", H, I))
        w13.append(torch.cat([g, u]))  # gate rows then up rows: mxq's "native" layout
        w13_scale.append(torch.cat([gs, us]))
        w2.append(d)
        w2_scale.append(ds)
    stack = torch.stack
    return (stack(w13), stack(w13_scale), None, stack(w2), stack(w2_scale), None, "native")


def _v4_from_module(module: torch.nn.Module, name: str, s: ExpertsSpec) -> Tuple[Any, ...]:
    E, H, I = s.num_experts, s.hidden_size, s.intermediate_size
    w13, w2 = module.gate_up_proj.data, module.down_proj.data
    w13_scale, w2_scale = module.gate_up_proj_scale_inv.data, module.down_proj_scale_inv.data
    _expect(w13, f"{name}.gate_up_proj", (E, 2 * I, H // 2), (torch.int8,))
    _expect(w2, f"{name}.down_proj", (E, H, I // 2), (torch.int8,))
    _expect(w13_scale, f"{name}.gate_up_proj_scale_inv", (E, 2 * I, H // 32), _SCALE_DTYPES)
    _expect(w2_scale, f"{name}.down_proj_scale_inv", (E, H, I // 32), _SCALE_DTYPES)
    return (_as_u8(w13), _as_u8(w13_scale), None, _as_u8(w2), _as_u8(w2_scale), None, "native")


def _quantize(w: Tensor) -> Tuple[Tensor, Tensor]:
    """MXFP4 of w [..., K] along K on the CPU (mxq's quantizer, scale rule "floor")."""
    blocks, scales = torch.ops.mxq.quantize_mxfp4(w.detach().to("cpu", torch.float32)
                                                  .contiguous())
    return blocks, _as_u8(scales)


def _from_bf16(module: torch.nn.Module, name: str, s: ExpertsSpec) -> Tuple[Any, ...]:
    """The opt-in quantization of the module's floating expert weights (not lossless in
    general: it is exact only where each 32-block already is E2M1 codes times one power of
    two, as a dequantized MXFP4 checkpoint is)."""
    if not module.gate_up_proj.dtype.is_floating_point or module.gate_up_proj.is_meta:
        raise _unsupported(f"{name}: quantize=True needs floating expert weights, found "
                           f"{module.gate_up_proj.dtype} on {module.gate_up_proj.device}")
    if s.family == "gpt-oss":  # [E, H, 2I] interleaved columns -> rows, as the checkpoint
        gate_up = _quantize(module.gate_up_proj.transpose(1, 2))
        down = _quantize(module.down_proj.transpose(1, 2))
        return (*gate_up, module.gate_up_proj_bias.detach().to(torch.bfloat16), *down,
                module.down_proj_bias.detach().to(torch.bfloat16), "gpt-oss")
    E = s.num_experts
    w13, w13_scale = _quantize(module.gate_up_proj)  # [E, 2I, H]: gate rows then up rows
    w2, w2_scale = _quantize(module.down_proj)
    return (w13.reshape(E, 2 * s.intermediate_size, -1), w13_scale, None,
            w2.reshape(E, s.hidden_size, -1), w2_scale, None, "native")


# --- the entry point -------------------------------------------------------------------------

def _module_device(module: torch.nn.Module) -> torch.device:
    for t in list(module.parameters(recurse=False)) + list(module.buffers(recurse=False)):
        if t is not None:
            return t.device
    return torch.device("cpu")


def _check_device(device: torch.device, where: str) -> None:
    if device.type == "meta":
        raise InvalidArgumentError(f"{where}: the experts are on the meta device (not loaded)")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise _unsupported(f"{where}: CUDA asked, but torch sees no CUDA device "
                               "(torch.cuda.is_available() is False)")
        if not _mxq.with_cuda:
            raise _unsupported(f"{where}: CUDA asked, but this mxq was built without CUDA "
                               "kernels (mxq.with_cuda is False; build with nvcc on the path)")
    elif device.type != "cpu":
        raise _unsupported(f"{where}: device {device}: mxq runs on the CPU and CUDA only")


def _check_not_distributed(name: str, module: torch.nn.Module) -> None:
    if getattr(module, "_is_expert_parallel", False):
        raise _unsupported(f"{name}: expert parallel (transformers' EP plan) is not supported "
                           "by the mxq experts implementation")
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        return
    if any(isinstance(p, DTensor) for p in module.parameters(recurse=False)):
        raise _unsupported(f"{name}: sharded (DTensor) expert weights, a tensor-parallel plan: "
                           "not supported by the mxq experts implementation")


def use_mxq_experts(model: torch.nn.Module,
                    checkpoint: Optional[Union[str, os.PathLike]] = None, *,
                    quantize: bool = False, device: Optional[Union[str, torch.device]] = None,
                    alignment: int = 128, activation_quant: str = "bf16",
                    set_implementation: bool = True) -> torch.nn.Module:
    """Prepares every routed-experts module of ``model`` for mxq and switches the model to the
    "mxq" experts implementation; returns ``model``.

    The MXFP4 weights come, as stored, from ``checkpoint`` (the checkpoint's directory or
    .safetensors file; default: the directory the model was loaded from, when the experts hold
    dequantized weights), or from the experts modules themselves when transformers kept them
    quantized (DeepSeek-V4's int8 FP4 experts). ``quantize=True`` instead quantizes the
    modules' floating weights with mxq's MXFP4 quantizer: an explicit opt-in, not lossless in
    general. The prepared tensors are made where each experts module's weights are (where its
    forward runs); ``device``, when given, says where the model is meant to run and is checked
    against that (move the model first). ``alignment`` is the kernels' padding of the
    intermediate size. ``activation_quant="fp8_g128"`` serves the experts W4A8: each expert
    GEMM's input rows (the hidden states, then the SwiGLU output) are quantized to E4M3 in
    groups of 128 before the multiply (docs/moe.md: it changes the numerics, so it is an opt-in;
    the default "bf16" is W4A16).

    Raises :class:`mxq.Error` (code "unsupported", "format" or "io") naming what is missing
    for a model mxq cannot serve (no experts module it serves, another quantization, TP / EP
    plans, CUDA without a CUDA device or without mxq's CUDA kernels, tensors missing from the
    checkpoint); everything is checked and prepared before the model is touched, so on error
    it is left as it was."""
    _import_transformers()
    register()
    experts = _find_experts(model)
    if not experts:
        raise _unsupported(f"{type(model).__name__} has no routed-experts module: mxq serves "
                           "gpt-oss and DeepSeek-V4 MoE models")
    _check_quantization(model)
    model_type = getattr(getattr(model, "config", None), "model_type", "")
    classes = _experts_classes()
    specs = {name: _spec(name, m, model_type, classes) for name, m in experts.items()}
    devices = {name: _module_device(m) for name, m in experts.items()}
    for name, m in experts.items():
        _check_not_distributed(name, m)
        where = devices[name]
        wanted = torch.device(device) if device is not None else where
        _check_device(wanted, name)
        if wanted.type != where.type or wanted.index not in (None, where.index):
            raise InvalidArgumentError(
                f"{name}: device={wanted}, but the experts are on {where} (the forward runs where "
                "the hidden states are): move the model first, e.g. model.to(device)",
                "device_mismatch")

    ckpt = None
    if not quantize and any(s.source == "bf16" for s in specs.values()):
        if checkpoint is None:
            checkpoint = getattr(getattr(model, "config", None), "_name_or_path", None)
            if not checkpoint or not Path(checkpoint).exists():
                raise _unsupported(
                    "the experts hold dequantized (floating) weights and no local checkpoint "
                    "is known: mxq serves the MXFP4 weights as stored, so pass checkpoint= (the "
                    "directory of the model's safetensors), or quantize=True to quantize the "
                    "floating weights (not lossless in general)")
        ckpt = _Checkpoint(checkpoint)

    # Every module's prepared tensors first; only then is the model changed.
    prepared: Dict[str, Mxfp4MoE] = {}
    for name, m in experts.items():
        s = specs[name]
        if s.source == "fp4":
            tensors = _v4_from_module(m, name, s)
        elif quantize:
            tensors = _from_bf16(m, name, s)
        elif s.family == "gpt-oss":
            tensors = _gpt_oss_from_checkpoint(ckpt, name, s)
        else:
            tensors = _v4_from_checkpoint(ckpt, name, s)
        *weights, layout = tensors
        config = getattr(m, "config", None) or getattr(model, "config", None)
        top_k = int(getattr(config, "num_experts_per_tok", 0) or
                    getattr(config, "experts_per_token", 0))
        moe = Mxfp4MoE(s.num_experts, s.hidden_size, s.intermediate_size, top_k,
                       has_bias=s.has_bias, router=False, alignment=alignment,
                       activation=s.activation, swiglu_alpha=s.swiglu_alpha,
                       swiglu_limit=s.swiglu_limit, activation_quant=activation_quant,
                       device=devices[name])
        prepared[name] = moe.load_experts(*weights, layout=layout)

    for name, m in experts.items():
        m.add_module(_CHILD, prepared[name])
    if set_implementation:
        _set_implementation(model, MXQ)
    return model


def _set_implementation(model: torch.nn.Module, name: str) -> None:
    setter: Optional[Callable[[str], Any]] = getattr(model, "set_experts_implementation", None)
    if setter is not None:
        setter(name)
    else:  # pragma: no cover (transformers without the setter)
        model.config._experts_implementation = name
