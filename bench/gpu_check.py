"""IREE on a GPU: artifacts cross-compiled here, checked and timed on a GPU machine.

Two steps, on two machines:

``prepare`` (here, with the IREE compiler; no GPU needed) compiles each case with
codegraft for ``iree:cuda:sm_80`` (or ``--device cpu``), and saves next to each artifact
the inputs and onnxruntime's CPU outputs (``.npz``) and the model (``.onnx``, for torch).

``check`` (on the GPU machine: Python, numpy, onnx, torch, the IREE runtime wheel, and
codegraft from this tree) loads each artifact with ``codegraft.load_executable``, compares
its outputs with the saved ones (1e-4 relative in float32) and times it: the median of
``--runs`` calls after warm-up, numpy in and out as codegraft's runtime gives them.  When
torch imports, the same model with the same weights runs in torch too (an ONNX interpreter
in ``torch.nn.functional``, cuDNN with ``benchmark=True``): eager float32, eager float16
channels-last, and float16 as a CUDA graph, the input already on the device.

    python bench/gpu_check.py prepare --out gpu_cases                 # here
    python bench/gpu_check.py check gpu_cases                          # on the GPU machine
    python bench/gpu_check.py prepare --device cpu --out c && python bench/gpu_check.py check c   # CPU path

Nothing here needs onnxruntime on the GPU machine, nor the IREE compiler.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

# (case name, light model, batch): the reference models of issue 14, resnet50 also at batch 32.
CASES = (
    ("squeezenet_b1", "squeezenet", 1),
    ("densenet121_b1", "densenet121", 1),
    ("resnet50_b1", "resnet50", 1),
    ("vgg19_b1", "vgg19", 1),
    ("resnet50_b32", "resnet50", 32),
)
# Weights are compiled into the artifacts (squeezenet 5 MB, densenet121 32 MB, resnet50 98 MB,
# vgg19 548 MB): these two fit the 64 MiB a device run carries beside the runtime wheel.
SMALL_CASES = ("squeezenet_b1", "densenet121_b1")
TOLERANCE = 1e-4


# ---------------------------------------------------------------------------- prepare (here)


def with_batch(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    """``model`` with batch ``batch``: the input's first dimension and Reshape targets' leading 1."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    if batch == 1:
        return model
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = batch
    reshape_shapes = {n.input[1] for n in model.graph.node if n.op_type == "Reshape"}
    for tensor in model.graph.initializer:
        if tensor.name in reshape_shapes:
            shape = numpy_helper.to_array(tensor).copy()
            if shape.size and shape[0] == 1:
                shape[0] = batch
            tensor.CopyFrom(numpy_helper.from_array(shape, tensor.name))
    for output in model.graph.output:
        output.type.tensor_type.ClearField("shape")
    del model.graph.value_info[:]
    return onnx.shape_inference.infer_shapes(model)


def light_case(name: str, batch: int) -> onnx.ModelProto:
    from codegraft.testing import light_model

    return with_batch(light_model(name), batch)


def prepare(out: pathlib.Path, target: str, cases: Sequence[str],
            build: Callable[[str, int], onnx.ModelProto] = light_case,
            table: Sequence[tuple[str, str, int]] = CASES) -> None:
    """Compile each case for ``target`` and save artifact, model, inputs and onnxruntime's outputs."""
    import codegraft as cg
    from codegraft.testing import random_feeds, run_onnxruntime

    out.mkdir(parents=True, exist_ok=True)
    manifest = []
    for case, light, batch in table:
        if cases and case not in cases:
            continue
        model = build(light, batch)
        feeds = random_feeds(model)
        expected = run_onnxruntime(model, feeds)
        start = time.perf_counter()
        exe = cg.compile(model, targets=[target])
        seconds = time.perf_counter() - start
        exe.save(out / f"{case}.cgx")
        onnx.save(model, out / f"{case}.onnx")
        np.savez(out / f"{case}.inputs.npz", **feeds)
        np.savez(out / f"{case}.expected.npz", **expected)
        backends = sorted({s.backend for s in exe.steps})
        manifest.append({"case": case, "model": light, "batch": batch, "target": target, "backends": backends,
                         "compile_s": round(seconds, 1)})
        print(f"{case}: compiled for {target} in {seconds:.1f} s, partitions on {backends}", flush=True)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


# ---------------------------------------------------------------------------- check (GPU machine)


def median_ms(run: Callable[[], Any], runs: int, warmup: int = 5, sync: Callable[[], None] = lambda: None) -> float:
    for _ in range(warmup):
        run()
    sync()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def relative_error(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> float:
    worst = 0.0
    for name, expected in want.items():
        actual = np.asarray(got[name], dtype=np.float64)
        if actual.shape != expected.shape:
            return float("inf")
        scale = max(float(np.max(np.abs(expected))), 1e-6)
        worst = max(worst, float(np.max(np.abs(actual - expected))) / scale)
    return worst


def check(folder: pathlib.Path, runs: int) -> int:
    import codegraft as cg

    manifest = json.loads((folder / "manifest.json").read_text())
    rows, failed = [], 0
    for entry in manifest:
        case = entry["case"]
        feeds = dict(np.load(folder / f"{case}.inputs.npz"))
        expected = dict(np.load(folder / f"{case}.expected.npz"))
        try:
            exe = cg.load_executable(folder / f"{case}.cgx")
            error = relative_error(exe.run(feeds), expected)
        except cg.CodegraftError as failure:  # one line: what is missing here (device, runtime)
            print(f"{case}: {failure}", flush=True)
            failed += 1
            continue
        ok = error <= TOLERANCE
        failed += not ok
        row = {"case": case, "target": entry["target"], "rel_error": error, "ok": ok,
               "iree_ms": median_ms(lambda exe=exe, feeds=feeds: exe.run(feeds), runs)}
        row.update(torch_timings(folder / f"{case}.onnx", feeds, expected, runs))
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(render(rows))
    (folder / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 1 if failed else 0


def render(rows: list[dict[str, Any]]) -> str:
    columns = ["iree_ms", "torch_fp32_ms", "torch_fp16_cl_ms", "torch_graph_fp16_ms"]
    lines = ["| case | target | rel. error | " + " | ".join(columns) + " |", "|---|---|---:|" + "---:|" * len(columns)]
    for row in rows:
        cells = [f"{row[c]:.2f}" if isinstance(row.get(c), float) else str(row.get(c, "-")) for c in columns]
        lines.append(f"| {row['case']} | {row['target']} | {row['rel_error']:.1e} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- torch on the same weights


def torch_timings(path: pathlib.Path, feeds: dict[str, np.ndarray], expected: dict[str, np.ndarray],
                  runs: int) -> dict[str, Any]:
    """torch eager fp32, eager fp16 channels-last and a fp16 CUDA graph of the same ONNX model."""
    try:
        import torch
    except ImportError:
        return {"torch": "not importable"}
    try:
        return _torch_timings(torch, path, feeds, expected, runs)
    except NotImplementedError as error:
        return {"torch": str(error)}


def _torch_timings(torch: Any, path: pathlib.Path, feeds: dict[str, np.ndarray], expected: dict[str, np.ndarray],
                   runs: int) -> dict[str, Any]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cudnn.benchmark = True
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    model = onnx.load(str(path))
    result: dict[str, Any] = {"torch_device": device}
    with torch.inference_mode():
        net = TorchInterpreter(model, device, torch.float32)
        (x,) = [torch.from_numpy(a).to(device) for a in feeds.values()]
        got = {name: t.float().cpu().numpy() for name, t in zip(net.outputs, net(x), strict=True)}
        result["torch_rel_error"] = relative_error(got, expected)
        result["torch_fp32_ms"] = median_ms(lambda: net(x), runs, sync=sync)
        if device != "cuda":
            return result
        half = TorchInterpreter(model, device, torch.float16, channels_last=True)
        xh = x.half().contiguous(memory_format=torch.channels_last)
        result["torch_fp16_cl_ms"] = median_ms(lambda: half(xh), runs, sync=sync)
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                half(xh)
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            half(xh)
        result["torch_graph_fp16_ms"] = median_ms(graph.replay, runs, sync=sync)
    return result


class TorchInterpreter:
    """Runs the ops of the onnx light models with ``torch.nn.functional``, weights on ``device``."""

    def __init__(self, model: onnx.ModelProto, device: str, dtype: Any, channels_last: bool = False) -> None:
        import torch

        self.torch = torch
        self.nodes = list(model.graph.node)
        self.input = model.graph.input[0].name
        self.outputs = [o.name for o in model.graph.output]
        self.consts: dict[str, Any] = {}
        for tensor in model.graph.initializer:
            array = numpy_helper.to_array(tensor)
            value = torch.from_numpy(array.copy()).to(device)
            if value.is_floating_point():
                value = value.to(dtype)
                if channels_last and value.dim() == 4:
                    value = value.contiguous(memory_format=torch.channels_last)
            self.consts[tensor.name] = value

    def __call__(self, x: Any) -> list[Any]:
        values = dict(self.consts)
        values[self.input] = x
        for node in self.nodes:
            args = [values[name] if name else None for name in node.input]
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            outs = self._op(node.op_type, args, attrs)
            for name, value in zip(node.output, outs, strict=False):
                values[name] = value
        return [values[name] for name in self.outputs]

    def _op(self, op: str, a: list[Any], at: dict[str, Any]) -> list[Any]:  # noqa: C901 - one table
        torch, fn = self.torch, self.torch.nn.functional
        if op == "Conv":
            pads = at.get("pads", [0, 0, 0, 0])
            x = a[0]
            if pads[0] != pads[2] or pads[1] != pads[3]:
                x, pads = fn.pad(x, (pads[1], pads[3], pads[0], pads[2])), [0, 0, 0, 0]
            return [fn.conv2d(x, a[1], a[2] if len(a) > 2 else None, at.get("strides", [1, 1]), pads[:2],
                              at.get("dilations", [1, 1]), at.get("group", 1))]
        if op == "BatchNormalization":
            return [fn.batch_norm(a[0], a[3], a[4], a[1], a[2], False, 0.0, at.get("epsilon", 1e-5))]
        if op == "Relu":
            return [torch.relu(a[0])]
        if op in ("MaxPool", "AveragePool"):
            pads = at.get("pads", [0, 0, 0, 0])
            x = a[0]
            pad_value = float("-inf") if op == "MaxPool" else 0.0
            if any(pads):
                x = fn.pad(x, (pads[1], pads[3], pads[0], pads[2]), value=pad_value)
            pool = fn.max_pool2d if op == "MaxPool" else fn.avg_pool2d
            return [pool(x, at["kernel_shape"], at.get("strides", [1, 1]), 0, ceil_mode=bool(at.get("ceil_mode", 0)))]
        if op == "GlobalAveragePool":
            return [fn.adaptive_avg_pool2d(a[0], 1)]
        if op in ("Sum", "Add"):
            out = a[0]
            for other in a[1:]:
                out = out + other
            return [out]
        if op == "Mul":
            return [a[0] * a[1]]
        if op == "Concat":
            return [torch.cat(a, dim=at["axis"])]
        if op == "Dropout":
            return [a[0]]
        if op == "Unsqueeze":
            out = a[0]
            for axis in sorted(at["axes"] if "axes" in at else a[1].tolist()):
                out = out.unsqueeze(axis)
            return [out]
        if op == "Reshape":
            return [a[0].reshape([int(d) for d in a[1].tolist()])]
        if op == "Flatten":
            return [a[0].flatten(at.get("axis", 1))]
        if op == "Gemm":
            weight = a[1].t() if at.get("transB", 0) else a[1]
            x = a[0].t() if at.get("transA", 0) else a[0]
            out = at.get("alpha", 1.0) * (x @ weight)
            return [out + at.get("beta", 1.0) * a[2] if len(a) > 2 else out]
        if op == "MatMul":
            return [a[0] @ a[1]]
        if op == "Softmax":
            return [torch.softmax(a[0], dim=at.get("axis", 1))]
        raise NotImplementedError(f"TorchInterpreter: {op} is not mapped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="compile the cases here and save the reference outputs")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("gpu_cases"))
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu: the CPU path, to test the script")
    p.add_argument("--arch", default=None, help="e.g. sm_80 (the default for cuda) or sm_89")
    p.add_argument("--cases", nargs="*", default=list(SMALL_CASES),
                   help=f"of {[c[0] for c in CASES]} (default: {list(SMALL_CASES)}; none given: all)")
    c = sub.add_parser("check", help="load, compare and time the prepared cases (on the GPU machine)")
    c.add_argument("folder", type=pathlib.Path)
    c.add_argument("--runs", type=int, default=50)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        target = "iree" if args.device == "cpu" else f"iree:{args.device}" + (f":{args.arch}" if args.arch else "")
        prepare(args.out, target, args.cases)
        return 0
    return check(args.folder, args.runs)


if __name__ == "__main__":
    sys.exit(main())
