"""What NaN propagation costs the ``c`` backend's elementwise kernels and Softmax.

Run from the repository root::

    .venv/bin/python -m bench.nan_cost [--threads 1] [--repeat 200]

Each op is compiled twice from the same generated source: once as it is (NaN propagates,
as in onnxruntime) and once with the comparisons written the old way (``x > 0 ? x : 0``,
``x < hi ? x : hi``, ...: a NaN input came out finite).  Both libraries run in the same
process on the same input, timed alternately call by call; the table gives the medians and
the ratio (above 1: propagating NaN is slower).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import replace

import numpy as np
import onnx_ir as ir
from onnx import TensorProto, helper

from bench.c_ops import median_pair
from codegraft.backend import Partition
from codegraft.backends.c import CBackend
from codegraft.backends.c._blob import Blob
from codegraft.backends.c._toolchain import host_target

# (new form, old form) for every comparison rewritten so that NaN propagates.
OLD_FORMS = (
    ("x = x > 88.0f ? 88.0f : x;", "x = x < 88.0f ? x : 88.0f;"),
    ("x = x < -87.0f ? -87.0f : x;", "x = x > -87.0f ? x : -87.0f;"),
    ("(x < -103.97f ? 0.0f : cg_exp(x))", "cg_exp(x)"),
    ("return a < b || b != b ? b : a;", "return a > b ? a : b;"),
    ("return a > b || b != b ? b : a;", "return a < b ? a : b;"),
    ("x = x < lo ? lo : x;\n  return x > hi ? hi : x;", "x = x > lo ? x : lo;\n  return x < hi ? x : hi;"),
)
SHAPE = (1, 64, 112, 112)


def _old_source(source: str) -> str:
    for new, old in OLD_FORMS:
        source = source.replace(new, old)
    return source


def _relu_old(source: str) -> str:
    return re.sub(r"\((\w+) < 0\.0f \? 0\.0f : \1\)", r"(\1 > 0.0f ? \1 : 0.0f)", source)


def cases() -> list[tuple[str, list]]:
    clip = [helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=0.5)]
    return [
        ("Relu", [helper.make_node("Relu", ["x"], ["y"])]),
        ("Clip", clip),
        ("Sigmoid", [helper.make_node("Sigmoid", ["x"], ["y"])]),
        ("Tanh", [helper.make_node("Tanh", ["x"], ["y"])]),
        ("Exp", [helper.make_node("Exp", ["x"], ["y"])]),
        ("Elu", [helper.make_node("Elu", ["x"], ["y"])]),
        ("Max", [helper.make_node("Max", ["x", "x"], ["y"])]),
        ("Softmax (last axis)", [helper.make_node("Softmax", ["x"], ["y"], axis=-1)]),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--ops", nargs="*", help="only these rows (default: all)")
    args = parser.parse_args()
    backend = CBackend(num_threads=args.threads)
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    print(f"{'op':<22} {'NaN-propagating ms':>19} {'old ms':>8} {'ratio':>6}")
    for name, nodes in cases():
        if args.ops and name.split()[0] not in args.ops:
            continue
        graph = helper.make_graph(
            nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(SHAPE))],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11 if name == "Clip" else 17)])
        if name == "Clip":
            model.opset_import[0].version = 6
        blob = Blob.decode(backend.compile(Partition(name, ir.from_proto(model))))
        old_source = _relu_old(_old_source(blob.source))
        assert old_source != blob.source, f"{name}: the old forms were not found in the source"
        old_blob = replace(blob, source=old_source, library=backend.toolchain.build(old_source, host_target()))
        new_run = backend.load(blob.encode())
        old_run = backend.load(old_blob.encode())
        new_ms, old_ms = median_pair(lambda r=new_run: r.run([x]), lambda r=old_run: r.run([x]), args.repeat)
        print(f"{name:<22} {new_ms:19.3f} {old_ms:8.3f} {new_ms / old_ms:6.3f}")


if __name__ == "__main__":
    main()
