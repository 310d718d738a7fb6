#!/usr/bin/env bash
# Issue 18's check on a many-core machine, as one command from a plain copy of the repository
# (numpy, onnx, onnx-ir, onnxscript, onnxruntime and a C compiler; nothing installed):
#
#     OUT=/some/folder bash bench/many_cores.sh [THREADS]        # THREADS default 1,4,16
#
# Writes into $OUT (default ./many_cores_out): machine.txt (CPU, caches, load), scaling.md
# (bench.c_models: c / onnxruntime per model and thread count, c's milliseconds, models whose c
# time grows with the thread count, outputs off onnxruntime by more than 1e-4),
# scaling_measured.md (the same beyond one thread, vgg19 aside, with c's threads per kernel
# measured at compile time: CBackend(measure_threads=True)), measure.md (bench.c_measure:
# squeezenet's and shufflenet's kernels timed at each count, picked against the cost model,
# and the whole-model plans timed), idle.md (the
# same at the largest count with every call after 50 ms idle),
# layers_T<max>.md (bench.c_layers --in-model: resnet50's, squeezenet's and shufflenet's convolutions, c
# against onnxruntime, at the largest count: which layers a gap comes from) and kernels.md
# (bench.c_kernels: every kernel of squeezenet, shufflenet and inception_v1 at each count, the
# ones slower with more threads flagged, then the cost model's estimates against the clock per
# kind of kernel: the check of SYNC_NS, WAKE_NS and the Machine rates in _thread_cost.py) and
# winograd.md (bench.winograd_layers --every-3x3: each layer that can run as Winograd against
# the same layer run directly, in the model, beyond one thread; those winograd_pays leaves direct
# marked forced).
# The steps run in that order of use: scaling, kernels, layers, then the c backend's tests on this
# machine's vector width (tests.txt; TESTS=0 skips them), idle, winograd, the measured ones last,
# so a run cut short by a time limit still brings back the done-when table first.
# About 10-11 minutes on 16 cores, most of it compiling (the measured steps about 3 of them;
# MEASURED=0 leaves them out, about 8, where a run must stay under the device's 10 minutes;
# winograd.md about 1).
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${1:-1,4,16}"
most="${threads##*,}"
out="${OUT:-many_cores_out}"
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
{
    date -u
    lscpu 2>/dev/null | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node\(s\)|L1d|L2|L3|Flags" || nproc
    echo "load: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)"
    "$py" -c "import onnxruntime, numpy; print('onnxruntime', onnxruntime.__version__, 'numpy', numpy.__version__)"  || true
    "${CC:-cc}" --version | head -1 || true
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"
"$py" -m bench.c_models --threads "$threads" --repeat 20 \
    --models resnet50,squeezenet,vgg19,inception_v1,densenet121,shufflenet 2>&1 | tee "$out/scaling.md"
# every kernel of the small models at each count: which ones do not scale
for model in squeezenet shufflenet inception_v1; do
    "$py" -m bench.c_kernels --model "$model" --threads "$threads" --repeat 21 --top 25 2>&1 | tee -a "$out/kernels.md"
done
# resnet50's, squeezenet's and shufflenet's convolutions against onnxruntime's at the largest count
for model in resnet50 squeezenet shufflenet; do
    "$py" -m bench.c_layers --in-model --model "$model" --threads "$most" --repeat 21 2>&1 | tee -a "$out/layers_T$most.md"
done
# the c backend's tests on this machine's vector width (CI's machines have AVX2 only): TESTS=0
# skips them; they need pytest, pytest-xdist and hypothesis
if [ "${TESTS:-1}" != 0 ]; then
    # the whole output (short tracebacks) in tests.txt: the reasons, not only the names, come back
    "$py" -m pytest -q -n "$(nproc)" -p no:cacheprovider --tb=short tests/test_c_*.py > "$out/tests.txt" 2>&1 || true
    tail -5 "$out/tests.txt"
fi
# each call after 50 ms idle, as a service's requests come: the workers wake for every call
"$py" -m bench.c_models --threads "$most" --repeat 10 --idle 50 \
    --models resnet50,squeezenet,inception_v1,densenet121,shufflenet 2>&1 | tee "$out/idle.md"
# Winograd layers against the same layers run directly, in the models, beyond one thread:
# whether winograd_pays (set at 1 thread on 2 cores) holds at the counts measured, the layers it
# leaves direct included (forced)
"$py" -m bench.winograd_layers --threads "${threads#1,}" --repeat 9 --every-3x3 \
    --models resnet50,vgg19,inception_v1,squeezenet 2>&1 | tee "$out/winograd.md"
# the same with every kernel's threads measured on this machine at compile time instead of
# estimated (CBackend(measure_threads=True)); one thread has nothing to measure, and vgg19
# (big convolutions only, every one on all threads either way) is the slowest to measure.
# MEASURED=0 skips it.
if [ "${MEASURED:-1}" != 0 ] && [ "$most" != 1 ]; then
    "$py" -m bench.c_models --threads "${threads#1,}" --repeat 10 --measure-threads \
        --models resnet50,squeezenet,inception_v1,densenet121,shufflenet 2>&1 | tee "$out/scaling_measured.md"
    # what the measurement found kernel by kernel for the two models issue 18 saw slower on 16
    "$py" -m bench.c_measure --model squeezenet,shufflenet --threads "$most" 2>&1 | tee "$out/measure.md"
fi
