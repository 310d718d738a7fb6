"""`make demo`: compile the real light_resnet50.onnx from the onnx wheel, run it, compare.

It compiles for the targets given on the command line (default: c, then openvino), prints
the partition report, runs the model, and prints the largest error against plain onnxruntime.
The shipped file computes every weight as ConstantOfShape(0.02), which makes the output
independent of the input; the demo swaps those for random weights of the same shapes and
compares logits (before the final Softmax), so the comparison means something.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import codegraft as cg
from codegraft.testing import light_model_path, randomize_constant_weights, run_onnxruntime


def main(argv: list[str]) -> int:
    path = light_model_path("resnet50")
    wanted = argv or ["c", "openvino"]
    available = {i.name for i in cg.list_backends() if i.available}
    targets = [t for t in wanted if t in available]
    skipped = sorted(set(wanted) - set(targets))
    print(f"model: {path}")
    if skipped:
        print(f"skipping unavailable targets: {', '.join(skipped)} (see `codegraft backends`)")
    import onnx

    model = randomize_constant_weights(onnx.load(str(path)), seed=0, drop_softmax=True)
    start = time.perf_counter()
    exe = cg.compile(model, targets=targets)
    print(f"compiled for {targets or ['host only']} in {time.perf_counter() - start:.1f} s\n")
    print(exe.report())

    rng = np.random.default_rng(0)
    feeds = {spec.name: rng.standard_normal([int(d) for d in spec.shape or ()]).astype(spec.dtype)
             for spec in exe.inputs}
    got = exe.run(feeds)
    want = run_onnxruntime(model, feeds)
    for name, expected in want.items():
        error = float(np.max(np.abs(got[name] - expected)))
        scale = float(np.max(np.abs(expected)))
        print(f"output {name}: shape {list(expected.shape)}, max |codegraft - onnxruntime| = {error:.3g} "
              f"(relative to max |logit| {scale:.3g}: {error / scale:.2g})")
    exe.save("demo-out.cgx")
    reloaded = cg.load_executable("demo-out.cgx")
    same = all(np.array_equal(reloaded.run(feeds)[k], got[k]) for k in got)
    print(f"saved demo-out.cgx; reloaded artifact gives identical outputs: {same}")
    print("\ntime per partition:")
    print(exe.profile(feeds, repeat=5))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
