"""C backend on random shapes and attributes (hypothesis) against onnxruntime.

Example counts are small on purpose: every example compiles C (identical sources hit the
on-disk cache, so shrinking is cheap).
"""

from __future__ import annotations

import numpy as np
from c_backend_util import check, make_model, needs_compiler
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

pytestmark = needs_compiler
SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _weights(seed: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, size=shape).astype(np.float32)


@st.composite
def conv_cases(draw: st.DrawFn) -> tuple[dict, tuple, tuple, bool]:
    spatial = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([1, 1, 2, 3]))
    depthwise = draw(st.booleans())
    cg = 1 if depthwise else draw(st.integers(1, 5))
    mg = 1 if depthwise and draw(st.booleans()) else draw(st.integers(1, 20))
    if depthwise:
        group = draw(st.integers(2, 20))
    kernel = [draw(st.integers(1, 4)) for _ in range(spatial)]
    strides = [draw(st.integers(1, 3)) for _ in range(spatial)]
    dilations = [draw(st.integers(1, 2)) for _ in range(spatial)]
    attrs: dict = {"group": group, "strides": strides, "dilations": dilations}
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    if auto_pad.startswith("SAME"):  # declined otherwise (see _support.py)
        attrs["dilations"] = dilations = [1] * spatial
        attrs["strides"] = strides = [min(s, k) for s, k in zip(strides, kernel, strict=True)]
    if auto_pad == "NOTSET":
        attrs["pads"] = [draw(st.integers(0, 2)) for _ in range(2 * spatial)]
    else:
        attrs["auto_pad"] = auto_pad
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    size = [draw(st.integers(e, e + 9)) for e in extent]
    x = (draw(st.integers(1, 2)), cg * group, *size)
    w = (mg * group, cg, *kernel)
    return attrs, x, w, draw(st.booleans())


@SETTINGS
@given(conv_cases(), st.integers(0, 2**16))
def test_conv_random(case: tuple[dict, tuple, tuple, bool], seed: int) -> None:
    attrs, x, w, bias = case
    inits = {"w": _weights(seed, *w)}
    names = ["x", "w"]
    if bias:
        inits["b"] = _weights(seed + 1, w[0])
        names.append("b")
    nodes = [helper.make_node("Conv", names, ["c"], **attrs), helper.make_node("Relu", ["c"], ["y"])]
    check(make_model(nodes, {"x": x}, ["y"], inits), seed=seed)


@st.composite
def pool_cases(draw: st.DrawFn) -> tuple[str, dict, tuple]:
    op = draw(st.sampled_from(["MaxPool", "AveragePool"]))
    spatial = draw(st.sampled_from([1, 2]))
    kernel = [draw(st.integers(1, 4)) for _ in range(spatial)]
    attrs: dict = {"kernel_shape": kernel, "strides": [draw(st.integers(1, 3)) for _ in range(spatial)]}
    dilations = [1] * spatial
    if op == "MaxPool" and draw(st.booleans()):
        dilations = [draw(st.integers(1, 2)) for _ in range(spatial)]
        attrs["dilations"] = dilations
    if op == "AveragePool":
        attrs["count_include_pad"] = draw(st.integers(0, 1))
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "VALID"]))
    if auto_pad == "SAME_UPPER":  # declined otherwise (see _support.py)
        attrs["dilations"] = dilations = [1] * spatial
        attrs["strides"] = [min(s, k) for s, k in zip(attrs["strides"], kernel, strict=True)]
    if auto_pad == "NOTSET":
        # onnxruntime requires pads smaller than the kernel
        attrs["pads"] = [draw(st.integers(0, k - 1)) for k in kernel * 2]
        attrs["ceil_mode"] = draw(st.integers(0, 1))
    else:
        attrs["auto_pad"] = auto_pad
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    size = [draw(st.integers(e, e + 8)) for e in extent]
    return op, attrs, (draw(st.integers(1, 2)), draw(st.integers(1, 20)), *size)


@SETTINGS
@given(pool_cases(), st.integers(0, 2**16))
def test_pool_random(case: tuple[str, dict, tuple], seed: int) -> None:
    op, attrs, x = case
    check(make_model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x}, ["y"], opset=19), seed=seed)


@st.composite
def matmul_cases(draw: st.DrawFn) -> tuple[tuple, tuple, bool]:
    m, k, n = draw(st.integers(1, 20)), draw(st.integers(1, 40)), draw(st.integers(1, 70))
    batch_a = draw(st.lists(st.sampled_from([1, 2, 3]), max_size=2))
    batch_b = draw(st.lists(st.sampled_from([1, 2, 3]), max_size=2))
    # make the batch axes broadcastable: where both exist and differ, one of them is 1
    for i in range(1, min(len(batch_a), len(batch_b)) + 1):
        if batch_a[-i] != batch_b[-i] and 1 not in (batch_a[-i], batch_b[-i]):
            batch_b[-i] = 1
    return (*batch_a, m, k), (*batch_b, k, n), draw(st.booleans())


@SETTINGS
@given(matmul_cases(), st.integers(0, 2**16))
def test_matmul_random(case: tuple[tuple, tuple, bool], seed: int) -> None:
    a, b, const_b = case
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    if const_b:
        model = make_model([node], {"a": a}, ["y"], {"b": _weights(seed, *b)})
    else:
        model = make_model([node], {"a": a, "b": b}, ["y"])
    check(model, seed=seed)


@SETTINGS
@given(st.integers(1, 16), st.integers(1, 40), st.integers(1, 70), st.booleans(), st.booleans(),
       st.sampled_from(["none", "row", "col", "full"]), st.integers(0, 2**16))
def test_gemm_random(m: int, k: int, n: int, ta: bool, tb: bool, bias: str, seed: int) -> None:
    inits = {"b": _weights(seed, *((n, k) if tb else (k, n)))}
    names = ["a", "b"]
    if bias != "none":
        inits["c"] = _weights(seed + 1, *{"row": (n,), "col": (m, 1), "full": (m, n)}[bias])
        names.append("c")
    node = helper.make_node("Gemm", names, ["y"], transA=int(ta), transB=int(tb), alpha=0.7, beta=1.3)
    check(make_model([node], {"a": (k, m) if ta else (m, k)}, ["y"], inits), seed=seed)


@st.composite
def broadcast_shapes(draw: st.DrawFn) -> tuple[tuple, tuple]:
    rank = draw(st.integers(1, 4))
    out = [draw(st.integers(1, 6)) for _ in range(rank)]
    a = [d if draw(st.booleans()) else 1 for d in out]
    b = [d if draw(st.booleans()) else 1 for d in out]
    return tuple(a[draw(st.integers(0, rank)) :]), tuple(b[draw(st.integers(0, rank)) :])


@SETTINGS
@given(
    broadcast_shapes(),
    st.lists(st.sampled_from(["Add", "Sub", "Mul", "Div", "Max", "Min", "Relu", "Tanh", "Sigmoid"]), min_size=1,
             max_size=4),
    st.integers(0, 2**16),
)
def test_elementwise_chain_random(shapes: tuple[tuple, tuple], ops: list[str], seed: int) -> None:
    nodes, current = [], "a"
    for index, op in enumerate(ops):
        out = f"t{index}"
        inputs = [current, "b"] if op in ("Add", "Sub", "Mul", "Div", "Max", "Min") else [current]
        if op == "Div":  # divide by 1 + |b|: well conditioned, so 1e-4 is a fair tolerance
            nodes.append(helper.make_node("Abs", ["b"], [f"s{index}"]))
            nodes.append(helper.make_node("Add", [f"s{index}", "one"], [f"d{index}"]))
            inputs = [current, f"d{index}"]
        nodes.append(helper.make_node(op, inputs, [out]))
        current = out
    nodes.append(helper.make_node("Identity", [current], ["y"]))
    check(make_model(nodes, {"a": shapes[0], "b": shapes[1]}, ["y"], {"one": np.float32(1.0)}), seed=seed)


@SETTINGS
@given(st.integers(1, 3), st.integers(1, 24), st.integers(2, 9), st.integers(0, 2**16))
def test_conv_block_with_layout_edges(n: int, c: int, size: int, seed: int) -> None:
    """Conv -> BN -> Relu -> (Add residual) -> Concat -> GlobalAveragePool -> Flatten -> Gemm."""
    rng = np.random.default_rng(seed)
    inits = {
        "w": _weights(seed, c, c, 3, 3), "s": rng.uniform(0.5, 1.5, c).astype(np.float32),
        "bb": _weights(seed + 1, c), "m": _weights(seed + 2, c), "v": rng.uniform(0.5, 1.5, c).astype(np.float32),
        "fw": _weights(seed + 3, 2 * c, 5),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("Add", ["r", "x"], ["res"]),
        helper.make_node("Concat", ["res", "x"], ["cat"], axis=1),
        helper.make_node("GlobalAveragePool", ["cat"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["f"]),
        helper.make_node("MatMul", ["f", "fw"], ["y"]),
    ]
    check(make_model(nodes, {"x": (n, c, size, size)}, ["y", "r"], inits), seed=seed)


@SETTINGS
@given(st.lists(st.integers(1, 20), min_size=1, max_size=5), st.randoms(use_true_random=False), st.integers(0, 2**16))
def test_transpose_random(shape: list[int], random: object, seed: int) -> None:
    perm = list(range(len(shape)))
    random.shuffle(perm)  # type: ignore[attr-defined]
    node = helper.make_node("Transpose", ["x"], ["y"], perm=perm)
    check(make_model([node], {"x": tuple(shape)}, ["y"]), seed=seed)


@SETTINGS
@given(st.data(), st.integers(0, 2**16))
def test_random_cnn_graphs(data: st.DataObject, seed: int) -> None:
    """Random DAGs of convs, pools, BN, activations, residual adds, concats and layout changes:
    checks that layout assignment and fusion agree with onnxruntime whatever the wiring."""
    rng = np.random.default_rng(seed)
    n, size = data.draw(st.integers(1, 2)), data.draw(st.integers(3, 7))
    tensors = {"x": data.draw(st.integers(1, 6))}  # name -> channels; all are [n, c, size, size]
    nodes, inits = [], {}

    def fresh(prefix: str) -> str:
        return f"{prefix}{len(nodes)}"

    for _ in range(data.draw(st.integers(1, 8))):
        kind = data.draw(st.sampled_from(["conv", "act", "add", "pool", "concat", "bn", "transpose"]))
        src = data.draw(st.sampled_from(sorted(tensors)))
        c, out = tensors[src], fresh("t")
        if kind == "conv":
            m, k = data.draw(st.integers(1, 12)), data.draw(st.sampled_from([1, 3]))
            inits[out + "w"] = rng.uniform(-1, 1, (m, c, k, k)).astype(np.float32)
            inits[out + "b"] = rng.uniform(-1, 1, m).astype(np.float32)
            nodes.append(helper.make_node("Conv", [src, out + "w", out + "b"], [out], pads=[k // 2] * 4))
            tensors[out] = m
        elif kind == "act":
            nodes.append(helper.make_node(data.draw(st.sampled_from(["Relu", "Sigmoid", "Tanh"])), [src], [out]))
            tensors[out] = c
        elif kind == "add":
            same = sorted(t for t, ch in tensors.items() if ch == c)
            other = data.draw(st.sampled_from(same))
            nodes.append(helper.make_node(data.draw(st.sampled_from(["Add", "Mul", "Sub"])), [src, other], [out]))
            tensors[out] = c
        elif kind == "pool":
            op = data.draw(st.sampled_from(["MaxPool", "AveragePool"]))
            nodes.append(helper.make_node(op, [src], [out], kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
            tensors[out] = c
        elif kind == "concat":
            other = data.draw(st.sampled_from(sorted(tensors)))
            nodes.append(helper.make_node("Concat", [src, other], [out], axis=1))
            tensors[out] = c + tensors[other]
        elif kind == "bn":
            names = [out + s for s in ("s", "b", "m", "v")]
            for name in names:
                inits[name] = rng.uniform(0.5, 1.5, c).astype(np.float32)
            nodes.append(helper.make_node("BatchNormalization", [src, *names], [out]))
            tensors[out] = c
        else:  # to NHWC, an activation there, and back: plain-layout ops between channels-last ones
            nodes.append(helper.make_node("Transpose", [src], [out + "a"], perm=[0, 2, 3, 1]))
            nodes.append(helper.make_node("Relu", [out + "a"], [out + "r"]))
            nodes.append(helper.make_node("Transpose", [out + "r"], [out], perm=[0, 3, 1, 2]))
            tensors[out] = c
    produced = sorted(t for t in tensors if t != "x")
    if not produced:
        return
    outputs = data.draw(st.lists(st.sampled_from(produced), min_size=1, max_size=2, unique=True))
    check(make_model(nodes, {"x": (n, tensors["x"], size, size)}, outputs, inits), seed=seed)


def _nhwc_twin(op: str, attrs: dict, x_shape: tuple, inits: dict[str, np.ndarray], names: list[str]) -> None:
    """``op`` in the codegraft.nhwc domain (input NHWC, weight OHWI) against the standard op."""
    from c_backend_util import run_c

    from codegraft.testing import assert_close, run_onnxruntime

    rank = len(x_shape)
    to_last = (0, *range(2, rank), 1)
    x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
    standard = make_model([helper.make_node(op, names, ["y"], **attrs)], {"x": x_shape}, ["y"], inits, opset=19)
    want = np.transpose(run_onnxruntime(standard, {"x": x})["y"], to_last)
    nhwc_inits = dict(inits)
    if "w" in inits:
        nhwc_inits["w"] = np.ascontiguousarray(np.transpose(inits["w"], to_last))
    nhwc_shape = tuple(x_shape[a] for a in to_last)
    node = helper.make_node(op, names, ["y"], domain="codegraft.nhwc", **attrs)
    model = make_model([node], {"x": nhwc_shape}, ["y"], nhwc_inits, opset=19, domains=["codegraft.nhwc"])
    got = run_c(model, {"x": np.ascontiguousarray(np.transpose(x, to_last))})["y"]
    assert_close({"y": got}, {"y": want})


@SETTINGS
@given(conv_cases(), st.integers(0, 2**16))
def test_nhwc_domain_conv_random(case: tuple[dict, tuple, tuple, bool], seed: int) -> None:
    attrs, x, w, bias = case
    inits = {"w": _weights(seed, *w)}
    if bias:
        inits["b"] = _weights(seed + 1, w[0])
    _nhwc_twin("Conv", attrs, x, inits, ["x", "w", "b"] if bias else ["x", "w"])


@SETTINGS
@given(pool_cases())
def test_nhwc_domain_pool_random(case: tuple[str, dict, tuple]) -> None:
    op, attrs, x = case
    _nhwc_twin(op, attrs, x, {}, ["x"])


@SETTINGS
@given(st.lists(st.integers(1, 5), min_size=3, max_size=4), st.booleans())
def test_nhwc_domain_batchnorm_and_global_pool(shape: list[int], global_pool: bool) -> None:
    c = shape[1]
    rng = np.random.default_rng(len(shape))
    if global_pool:
        _nhwc_twin("GlobalAveragePool", {}, tuple(shape), {}, ["x"])
        return
    inits = {k: rng.uniform(0.5, 1.5, c).astype(np.float32) for k in ("s", "b", "m", "v")}
    _nhwc_twin("BatchNormalization", {}, tuple(shape), inits, ["x", "s", "b", "m", "v"])


@SETTINGS
@given(st.lists(st.integers(1, 6), min_size=1, max_size=4), st.data())
def test_axis_ops_random(shape: list[int], data: st.DataObject) -> None:
    rank = len(shape)
    op = data.draw(st.sampled_from(["Softmax", "ReduceMean", "Concat", "Flatten", "LeakyRelu", "Clip", "HardSigmoid"]))
    inputs: dict[str, tuple] = {"x": tuple(shape)}
    attrs: dict = {}
    names = ["x"]
    opset = 17
    if op == "Softmax":
        opset = data.draw(st.sampled_from([11, 13]))
        attrs["axis"] = data.draw(st.integers(-rank, rank - 1))
    elif op == "ReduceMean":
        attrs["axes"] = data.draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique=True))
        if len({a % rank for a in attrs["axes"]}) != len(attrs["axes"]):
            attrs["axes"] = [attrs["axes"][0]]
        attrs["keepdims"] = data.draw(st.integers(0, 1))
        opset = 13
    elif op == "Concat":
        axis = data.draw(st.integers(-rank, rank - 1))
        other = list(shape)
        other[axis % rank] = data.draw(st.integers(1, 4))
        inputs["z"] = tuple(other)
        names, attrs["axis"] = ["x", "z"], axis
    elif op == "Flatten":
        attrs["axis"] = data.draw(st.integers(0, rank))
    elif op == "LeakyRelu":
        attrs["alpha"] = data.draw(st.floats(-2, 2))
    elif op == "Clip":
        low = data.draw(st.floats(-2, 1))
        attrs = {"min": low, "max": low + data.draw(st.floats(0, 2))}
        opset = 6
    else:
        attrs = {"alpha": data.draw(st.floats(0.05, 1)), "beta": data.draw(st.floats(-1, 1))}
    check(make_model([helper.make_node(op, names, ["y"], **attrs)], inputs, ["y"], opset=opset))


@SETTINGS
@given(st.lists(st.integers(1, 6), max_size=3), st.integers(1, 70), st.data())
def test_layer_normalization_random(lead: list[int], last: int, data: st.DataObject) -> None:
    shape = [*lead, last]
    rank = len(shape)
    axis = data.draw(st.integers(-rank, rank - 1))
    normalized = shape[axis % rank:]
    seed = data.draw(st.integers(0, 2**16))
    inits = {"s": _weights(seed, *normalized)}
    names = ["x", "s"]
    if data.draw(st.booleans()):
        inits["b"] = _weights(seed + 1, *normalized)
        names.append("b")
    attrs = {"axis": axis, "epsilon": data.draw(st.sampled_from([1e-5, 1e-12, 0.1]))}
    node = helper.make_node("LayerNormalization", names, ["y"], **attrs)
    check(make_model([node], {"x": tuple(shape)}, ["y"], inits), seed=seed)


@st.composite
def depthwise_cases(draw: st.DrawFn) -> tuple[dict, tuple, tuple]:
    """groups == channels: channel counts across SIMD widths, rows wide enough for interior blocks."""
    spatial = draw(st.sampled_from([1, 2, 2]))
    channels = draw(st.integers(1, 40))
    kernel = [draw(st.integers(1, 5)) for _ in range(spatial)]
    dilations = [draw(st.integers(1, 2)) for _ in range(spatial)]
    attrs: dict = {"group": channels, "strides": [draw(st.integers(1, 3)) for _ in range(spatial)],
                   "dilations": dilations, "pads": [draw(st.integers(0, 3)) for _ in range(2 * spatial)]}
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    size = [draw(st.integers(max(e - 2, 1), e + 26)) for e in extent]
    size = [max(s, e - p0 - p1) for s, e, p0, p1 in
            zip(size, extent, attrs["pads"][:spatial], attrs["pads"][spatial:], strict=True)]
    return attrs, (draw(st.integers(1, 2)), channels, *size), (channels, 1, *kernel)


@SETTINGS
@given(depthwise_cases(), st.integers(0, 2**16))
def test_depthwise_conv_random(case: tuple[dict, tuple, tuple], seed: int) -> None:
    attrs, x, w = case
    c = x[1]
    inits = {"w": _weights(seed, *w), "b": _weights(seed + 1, c), "lo": np.float32(0.0), "hi": np.float32(0.6)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs),
             helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]
    check(make_model(nodes, {"x": x}, ["y"], inits), seed=seed)


@st.composite
def stored_reshapes(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """A shape, a physical order of it, and a new shape made by splitting and merging axes."""
    factors = draw(st.lists(st.integers(1, 4), min_size=1, max_size=6))
    cuts_old = sorted(draw(st.sets(st.integers(1, len(factors) - 1), max_size=len(factors) - 1))) \
        if len(factors) > 1 else []
    cuts_new = sorted(draw(st.sets(st.integers(1, len(factors) - 1), max_size=len(factors) - 1))) \
        if len(factors) > 1 else []

    def grouped(cuts: list[int]) -> tuple[int, ...]:
        edges = [0, *cuts, len(factors)]
        return tuple(int(np.prod(factors[a:b])) for a, b in zip(edges, edges[1:], strict=False))

    shape = grouped(cuts_old)
    perm = tuple(draw(st.permutations(range(len(shape)))))
    return shape, perm, grouped(cuts_new)


@given(stored_reshapes())
@settings(max_examples=200, deadline=None)
def test_reshape_views_of_stored_tensors_keep_the_bytes(case: tuple) -> None:
    """Whenever layout keeps a reshape as a view (``view_perm``), the stored bytes really are the same."""
    from codegraft.backends.c._layout import view_perm

    shape, perm, new_shape = case
    x = np.arange(int(np.prod(shape))).reshape(shape)
    found = view_perm(shape, perm, new_shape)
    if perm == tuple(range(len(shape))):
        assert found is not None  # a plain tensor reshapes in place
    if found is not None:
        assert sorted(found) == list(range(len(new_shape)))
        stored = np.transpose(x, perm).reshape(-1)
        assert (np.transpose(x.reshape(new_shape), found).reshape(-1) == stored).all()
