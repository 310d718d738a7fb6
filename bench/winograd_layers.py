"""Each Winograd layer of a light model against the same layer run directly, inside the model.

``python -m bench.winograd_layers [--models resnet50,vgg19] [--threads 1,4,16] [--repeat 15]``
builds each model twice on ``c`` (``CBackend(winograd=True)`` and ``winograd=False``), calls
the two in turn, and reads every Conv's time from the libraries' own kernel timers.  For the
Convs that run as Winograd F(2x2, 3x3) (``ops/winograd.py``) it prints, per kind of layer,
the summed medians both ways and their ratio, then the whole model's kernels both ways: the
check of ``winograd_pays`` on the machine at hand and at each thread count (it was set from
such a run at 1 thread on a 2-core Sapphire Rapids VM, ``bench/MANY_CORES.md``).  A layer
timed inside its model finds its input where the kernel before left it, in the caches, which
a layer timed alone does not: alone, several layers paid that did not in the models.

With ``--every-3x3`` every Conv that can run as Winograd (``winograd_fits``: 3x3, stride 1, no
groups, enough tiles) does, whether ``winograd_pays`` takes it or not, and the layers it would
leave direct are marked ``forced``: where the rule leaves time on the table on this machine
(on a Zen 3, AVX2, it had left layers direct that ran 0.49-0.83x as long as Winograd).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from collections import defaultdict
from unittest import mock

import onnx
from onnx import shape_inference

from bench.c_ops import on_c
from codegraft.backends.c._blocking import host_blocking
from codegraft.backends.c._toolchain import host_target
from codegraft.backends.c.ops import winograd
from codegraft.backends.c.ops.winograd import winograd_fits, winograd_pays
from codegraft.testing import light_model

MODELS = "resnet50,vgg19,inception_v1,squeezenet,densenet121"


def winograd_layers(model: onnx.ModelProto, l2_bytes: int, vector_floats: int, every: bool = False) -> dict[str, str]:
    """Conv node name -> ``C->K @HxW`` for the Convs run as Winograd where the L2 has ``l2_bytes``
    and the code ``vector_floats`` floats per register; with ``every``, for every Conv that can
    (:func:`winograd_fits`), `` forced`` after those :func:`winograd_pays` leaves direct."""
    inferred = shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in [*inferred.graph.value_info, *inferred.graph.output]}
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    found = {}
    for node in model.graph.node:
        weight, out = weights.get(node.input[1]) if node.op_type == "Conv" else None, shapes.get(node.output[0])
        if weight is None or out is None or len(weight) != 4:
            continue
        attributes = {a.name: a for a in node.attribute}
        ints = {name: tuple(attributes[name].ints) for name in ("strides", "dilations") if name in attributes}
        group = attributes["group"].i if "group" in attributes else 1
        kernel, strides, dilations = (weight[2], weight[3]), ints.get("strides", (1, 1)), ints.get("dilations", (1, 1))
        name = f"{weight[1] * group}->{weight[0]} @{out[2]}x{out[3]}"
        if winograd_pays(kernel, strides, dilations, group, weight[1] * group, weight[0], out[2], out[3], l2_bytes,
                         vector_floats):
            found[node.name] = name
        elif every and winograd_fits(kernel, strides, dilations, group, weight[0], out[2], out[3]):
            found[node.name] = name + " forced"
    return found


def _fits(kernel: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int], group: int,
          channels_in: int, channels_out: int, out_h: int, out_w: int, l2_bytes: int = 0,
          vector_floats: int = 0) -> bool:
    """``winograd_pays``'s stand-in for ``--every-3x3``: every Conv that fits."""
    return winograd_fits(kernel, strides, dilations, group, channels_out, out_h, out_w)


def compare(name: str, threads: int, repeat: int, every: bool = False) -> list[str]:
    """The Markdown rows of one model at one thread count (``every``: ``--every-3x3``)."""
    model = light_model(name)
    direct, inputs, _ = on_c(model, threads, seed=1, winograd=False)
    with mock.patch.object(winograd, "winograd_pays", _fits) if every else contextlib.nullcontext():
        forced, _, _ = on_c(model, threads, seed=1, winograd=True)
    times: list[dict[str, list[float]]] = [defaultdict(list), defaultdict(list)]
    for call in range(repeat + 1):
        for side, runnable in enumerate((direct, forced)):
            for op in runnable.profile_ops(inputs, 1, warm_up=call == 0):
                times[side][op.name].append(op.ms)
    medians = [{node: statistics.median(ms) for node, ms in side.items()} for side in times]
    vector = host_target().vector_floats
    layers = winograd_layers(model, host_blocking(vector).l2, vector, every)
    kinds: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for node, kind in layers.items():
        entry = kinds[kind]
        entry[0] += medians[0].get(node, 0.0)
        entry[1] += medians[1].get(node, 0.0)
        entry[2] += 1
    rows = [f"| {name} | {threads} | {kind} ({int(n)}) | {a:.3f} | {b:.3f} | {b / a:.2f} |"
            for kind, (a, b, n) in kinds.items() if a > 0]
    total = [sum(side.values()) for side in medians]
    rows.append(f"| {name} | {threads} | all kernels | {total[0]:.2f} | {total[1]:.2f} | {total[1] / total[0]:.3f} |")
    direct.release_threads()
    forced.release_threads()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--threads", default="1")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--every-3x3", action="store_true",
                        help="every Conv that can run as Winograd does (those the rule leaves direct marked forced)")
    args = parser.parse_args()
    print("| model | threads | Winograd layers (count) | direct ms | Winograd ms | Winograd / direct |")
    print("|---|---:|---|---:|---:|---:|")
    for threads in (int(t) for t in args.threads.split(",")):
        for name in args.models.split(","):
            for row in compare(name, threads, args.repeat, args.every_3x3):
                print(row, flush=True)


if __name__ == "__main__":
    main()
