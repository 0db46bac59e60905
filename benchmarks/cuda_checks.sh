#!/usr/bin/env bash
# The checks that need a CUDA GPU, as one script: the CUDA tests, then the packing and engine
# throughput benchmarks in CUDA mode. Run from the repository root on a GPU host whose python3
# has torch with CUDA and fedtune's engine dependencies (docs/explanation/benchmarks.md):
#
#     OUT=/some/folder bash benchmarks/cuda_checks.sh
#
# Writes cuda_tests.log, pack_profile_cuda.json, packing_cuda.json, pack_baselines_cuda.json and
# engine_throughput_cuda.json into $OUT (default: benchmarks/results); THROUGHPUT=0 leaves out
# engine_throughput.py. The one deselected test needs MLflow (fedtune[tune]), which a GPU image
# with only the engine's dependencies lacks. Each benchmark has a time limit so that one slow
# part cannot take the others' time.
set -u
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
python3 -m pytest -q -p no:cacheprovider -o addopts="-ra" \
    tests/unit/test_packed_cuda.py tests/unit/test_runners_cli.py \
    tests/unit/test_engine_throughput_benchmark.py \
    --deselect tests/unit/test_runners_cli.py::test_tune_summary_explains_more_trials_than_the_target \
    2>&1 | tee "$OUT/cuda_tests.log"
# where a pack's round goes on the GPU (host phases, device time, launches)
timeout "${PROFILE_LIMIT:-90}" python3 benchmarks/pack_profile.py --device cuda \
    --out "$OUT/pack_profile_cuda.json" || echo "pack_profile.py --device cuda: exit $?"
# one torch thread in the pack, as in each separate process: on a GPU the threads only run the
# host side
timeout "${PACKING_LIMIT:-240}" python3 benchmarks/packing.py --device cuda --target 1.0 \
    --pack-threads 1 --out "$OUT/packing_cuda.json" || echo "packing.py --device cuda: exit $?"
# the pack against hand-written torch.func loops, plain and captured as a CUDA graph: the
# reference of the GPU issue (pack ≥ 0.5× the graph at P = 64, 256, 1,024)
timeout "${BASELINES_LIMIT:-240}" python3 benchmarks/pack_baselines.py --device cuda \
    --sizes 1,64,256,1024 --target 1.0 --out "$OUT/pack_baselines_cuda.json" \
    || echo "pack_baselines.py --device cuda: exit $?"
if [ "${THROUGHPUT:-1}" = 1 ]; then
    timeout "${THROUGHPUT_LIMIT:-150}" python3 benchmarks/engine_throughput.py --device cuda \
        --out "$OUT/engine_throughput_cuda.json" || echo "engine_throughput.py --device cuda: exit $?"
fi
