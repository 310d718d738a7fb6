"""The benchmark zoo: models generated here with ``onnx.helper`` plus the onnx wheel's light models.

NOTE: every model is built in-repo from a fixed seed, so the benchmark needs no download
and two runs measure the same weights.  Weights are uniform in ``±sqrt(3/fan_in)``
(unit variance through a layer) so activations stay in a realistic range and numerical
comparisons see real values, not zeros or infinities.  Graphs are written the way
exporters write them (LayerNormalization, Gelu spelled with Erf, Relu6 as Clip, unfused
BatchNormalization), since that is what a backend meets in practice.

Example::

    from bench.zoo import ZOO, build
    model = build("transformer")        # onnx.ModelProto
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from codegraft.testing import light_model

OPSET = 17  # LayerNormalization is opset 17


@dataclass(frozen=True)
class ZooModel:
    """One benchmark model: a name, what it is, and how to build it."""

    name: str
    description: str
    build: Callable[[], onnx.ModelProto]


class _GraphBuilder:
    """Accumulates nodes and random initializers with unique names."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def fresh(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}_{self._count}"

    def weight(self, shape: tuple[int, ...], fan_in: int, prefix: str = "w") -> str:
        bound = math.sqrt(3.0 / fan_in)
        return self.const(self.rng.uniform(-bound, bound, size=shape).astype(np.float32), prefix)

    def const(self, value: np.ndarray, prefix: str = "c") -> str:
        name = self.fresh(prefix)
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def op(self, op_type: str, inputs: list[str], n_outputs: int = 1, **attrs: Any) -> list[str]:
        outputs = [self.fresh(op_type.lower()) for _ in range(n_outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=self.fresh(op_type), **attrs))
        return outputs

    def op1(self, op_type: str, inputs: list[str], **attrs: Any) -> str:
        return self.op(op_type, inputs, **attrs)[0]

    def model(self, name: str, inputs: list[onnx.ValueInfoProto], output: str) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            name,
            inputs,
            [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
            initializer=self.initializers,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 8
        return onnx.shape_inference.infer_shapes(model, strict_mode=True)


# --- transformer encoder ------------------------------------------------------------------
def transformer_encoder(
    layers: int = 4, d_model: int = 256, heads: int = 4, seq: int = 128, batch: int = 1, seed: int = 0
) -> onnx.ModelProto:
    """A pre-LayerNorm encoder stack: attention (MatMul, Softmax) and an Erf-Gelu MLP."""
    g = _GraphBuilder(seed)
    head_dim = d_model // heads
    x = "tokens"
    split = g.const(np.array([d_model] * 3, np.int64), "split")
    to_heads = g.const(np.array([0, 0, heads, head_dim], np.int64), "shape")
    to_model = g.const(np.array([0, 0, d_model], np.int64), "shape")
    scale = g.const(np.array(1.0 / math.sqrt(head_dim), np.float32), "scale")
    for _ in range(layers):
        h = _layer_norm(g, x, d_model)
        qkv = g.op1("Add", [g.op1("MatMul", [h, g.weight((d_model, 3 * d_model), d_model)]), _bias(g, 3 * d_model)])
        q, k, v = g.op("Split", [qkv, split], n_outputs=3, axis=-1)
        q = g.op1("Transpose", [g.op1("Reshape", [q, to_heads])], perm=[0, 2, 1, 3])
        k = g.op1("Transpose", [g.op1("Reshape", [k, to_heads])], perm=[0, 2, 3, 1])
        v = g.op1("Transpose", [g.op1("Reshape", [v, to_heads])], perm=[0, 2, 1, 3])
        scores = g.op1("Mul", [g.op1("MatMul", [q, k]), scale])
        attention = g.op1("MatMul", [g.op1("Softmax", [scores], axis=-1), v])
        merged = g.op1("Reshape", [g.op1("Transpose", [attention], perm=[0, 2, 1, 3]), to_model])
        projected = g.op1("Add", [g.op1("MatMul", [merged, g.weight((d_model, d_model), d_model)]), _bias(g, d_model)])
        x = g.op1("Add", [x, projected])
        h = _layer_norm(g, x, d_model)
        up = g.op1("Add", [g.op1("MatMul", [h, g.weight((d_model, 4 * d_model), d_model)]), _bias(g, 4 * d_model)])
        down = g.op1("MatMul", [_gelu_erf(g, up), g.weight((4 * d_model, d_model), 4 * d_model)])
        x = g.op1("Add", [x, g.op1("Add", [down, _bias(g, d_model)])])
    out = _layer_norm(g, x, d_model)
    source = helper.make_tensor_value_info("tokens", TensorProto.FLOAT, [batch, seq, d_model])
    return g.model("transformer_encoder", [source], out)


def _layer_norm(g: _GraphBuilder, x: str, width: int) -> str:
    gamma = g.const(g.rng.uniform(0.8, 1.2, size=width).astype(np.float32), "gamma")
    beta = g.const(g.rng.uniform(-0.1, 0.1, size=width).astype(np.float32), "beta")
    return g.op1("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-5)


def _bias(g: _GraphBuilder, width: int) -> str:
    return g.const(g.rng.uniform(-0.1, 0.1, size=width).astype(np.float32), "b")


def _gelu_erf(g: _GraphBuilder, x: str) -> str:
    """``0.5 * x * (1 + erf(x / sqrt 2))``, the way PyTorch exports exact Gelu."""
    inv_sqrt2 = g.const(np.array(1.0 / math.sqrt(2.0), np.float32), "c")
    one = g.const(np.array(1.0, np.float32), "c")
    half = g.const(np.array(0.5, np.float32), "c")
    erf = g.op1("Erf", [g.op1("Mul", [x, inv_sqrt2])])
    return g.op1("Mul", [g.op1("Mul", [x, g.op1("Add", [erf, one])]), half])


# --- MobileNet ------------------------------------------------------------------------------
# (output channels, stride) of each depthwise-separable block, MobileNet v1's layout.
_MOBILENET_BLOCKS = (
    (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
    (512, 1), (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1),
)  # fmt: skip


def mobilenet(resolution: int = 224, classes: int = 1000, batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """Depthwise-separable convolutions with BatchNormalization, Relu6 (Clip) and HardSwish."""
    g = _GraphBuilder(seed)
    relu6 = (g.const(np.array(0.0, np.float32), "c"), g.const(np.array(6.0, np.float32), "c"))
    x = _conv_bn(g, "image", 3, 32, kernel=3, stride=2, group=1)
    x = g.op1("HardSwish", [x])
    channels = 32
    for index, (out_channels, stride) in enumerate(_MOBILENET_BLOCKS):
        x = _conv_bn(g, x, channels, channels, kernel=3, stride=stride, group=channels)
        x = g.op1("Clip", [x, *relu6])
        x = _conv_bn(g, x, channels, out_channels, kernel=1, stride=1, group=1)
        # Later blocks use HardSwish as MobileNet v3 does; early ones Relu6.
        x = g.op1("HardSwish", [x]) if index >= len(_MOBILENET_BLOCKS) // 2 else g.op1("Clip", [x, *relu6])
        channels = out_channels
    pooled = g.op1("Flatten", [g.op1("GlobalAveragePool", [x])], axis=1)
    logits = g.op1("Gemm", [pooled, g.weight((classes, channels), channels), _bias(g, classes)], transB=1)
    image = helper.make_tensor_value_info("image", TensorProto.FLOAT, [batch, 3, resolution, resolution])
    return g.model("mobilenet", [image], logits)


def _conv_bn(g: _GraphBuilder, x: str, c_in: int, c_out: int, *, kernel: int, stride: int, group: int) -> str:
    fan_in = (c_in // group) * kernel * kernel
    weight = g.weight((c_out, c_in // group, kernel, kernel), fan_in)
    pad = kernel // 2
    y = g.op1("Conv", [x, weight], kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4, group=group)
    scale = g.const(g.rng.uniform(0.8, 1.2, size=c_out).astype(np.float32), "bn_scale")
    shift = _bias(g, c_out)
    mean = _bias(g, c_out)
    var = g.const(g.rng.uniform(0.5, 1.5, size=c_out).astype(np.float32), "bn_var")
    return g.op1("BatchNormalization", [y, scale, shift, mean, var], epsilon=1e-5)


# --- MLP ------------------------------------------------------------------------------------
def mlp(batch: int = 64, sizes: tuple[int, ...] = (512, 1024, 1024, 1024, 10), seed: int = 0) -> onnx.ModelProto:
    """Gemm + Relu layers; the last layer has no activation (logits)."""
    g = _GraphBuilder(seed)
    x = "features"
    for index, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        x = g.op1("Gemm", [x, g.weight((fan_in, fan_out), fan_in), _bias(g, fan_out)])
        if index < len(sizes) - 2:
            x = g.op1("Relu", [x])
    features = helper.make_tensor_value_info("features", TensorProto.FLOAT, [batch, sizes[0]])
    return g.model("mlp", [features], x)


# --- pointwise pipeline -------------------------------------------------------------------
def pointwise(stages: int = 12, channels: int = 64, size: int = 112, seed: int = 0) -> onnx.ModelProto:
    """Per-channel scale and shift then HardSwish (as Mul(x, HardSigmoid(x))), ``stages`` times.

    Feature normalisation and activation stacks look like this: all memory traffic, no
    arithmetic to hide it.  A code generator that fuses the whole chain into one loop reads
    the tensor once; op-by-op runtimes read it once per op.
    """
    g = _GraphBuilder(seed)
    x = "image"
    for _ in range(stages):
        scale = g.const(g.rng.uniform(0.5, 1.5, (1, channels, 1, 1)).astype(np.float32))
        shift = g.const(g.rng.uniform(-0.5, 0.5, (1, channels, 1, 1)).astype(np.float32))
        x = g.op1("Add", [g.op1("Mul", [x, scale]), shift])
        x = g.op1("Mul", [x, g.op1("HardSigmoid", [x])])
    image = helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, channels, size, size])
    return g.model("pointwise", [image], x)


# --- a transformer block as torch exports it ----------------------------------------------------
def torch_encoder(d_model: int = 256, heads: int = 4, seq: int = 128, seed: int = 0) -> onnx.ModelProto:
    """``nn.TransformerEncoderLayer`` (GELU, ff 4*d) exported by ``torch.onnx.export(dynamo=True)``
    with a dynamic batch: what a PyTorch user hands codegraft (shape arithmetic, allowzero
    Reshapes, Gathers included).  Needs torch (a dev dependency)."""
    import torch

    from codegraft.frontend.torch_export import export_module

    torch.manual_seed(seed)
    block = torch.nn.TransformerEncoderLayer(
        d_model, heads, dim_feedforward=4 * d_model, dropout=0.0, activation="gelu", batch_first=True
    ).eval()
    tokens = torch.randn(2, seq, d_model)
    return export_module(block, (tokens,), dynamic_shapes={"src": {0: "batch"}}).proto


# --- the zoo --------------------------------------------------------------------------------
def _light(name: str) -> Callable[[], onnx.ModelProto]:
    def build() -> onnx.ModelProto:
        return onnx.shape_inference.infer_shapes(light_model(name))

    return build


ZOO: tuple[ZooModel, ...] = (
    ZooModel("transformer", "encoder, 4 layers, d=256, 4 heads, seq 128", transformer_encoder),
    ZooModel("torch_encoder", "nn.TransformerEncoderLayer d=256, 4 heads, seq 128, torch's dynamo export",
             torch_encoder),
    ZooModel("mobilenet", "MobileNet-style, depthwise-separable, 224x224", mobilenet),
    ZooModel("mlp", "MLP 512-1024-1024-1024-10, batch 64", mlp),
    ZooModel("pointwise", "12 x (per-channel scale, shift, HardSwish) on 1x64x112x112", pointwise),
    ZooModel("resnet50", "onnx light model, random weights", _light("resnet50")),
    ZooModel("squeezenet", "onnx light model, random weights", _light("squeezenet")),
    ZooModel("densenet121", "onnx light model, random weights", _light("densenet121")),
    ZooModel("inception_v1", "onnx light model, random weights", _light("inception_v1")),
    ZooModel("shufflenet", "onnx light model, random weights", _light("shufflenet")),
)


def names() -> list[str]:
    """Names of the zoo models, in benchmark order."""
    return [m.name for m in ZOO]


def build(name: str) -> onnx.ModelProto:
    """Build the zoo model called ``name``."""
    for entry in ZOO:
        if entry.name == name:
            return entry.build()
    raise KeyError(f"no zoo model {name!r}; known: {', '.join(names())}")
