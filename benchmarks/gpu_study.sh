#!/usr/bin/env bash
# Real studies through Ray Tune, Optuna and MLflow on a GPU host, from wheels carried to it:
# nothing is fetched. Run from the repository root on a host whose python3 has torch with CUDA
# (the lent GPU machines' image):
#
#     WHEELS=.whl OUT=benchmarks/results bash benchmarks/gpu_study.sh
#
# WHEELS is the folder `python tools/gpu_wheels.py download` laid out (Ray, Optuna, MLflow and
# what they need that the image lacks, in carry groups g1, g2 … of under 64 MiB each). The
# script puts the wheels back together and checks them (tools/gpu_wheels.py assemble), installs
# them into $SITE (not the image's site-packages), then runs benchmarks/gpu_study.py: a study
# with resources.gpu: 0.25 (four trials on one GPU) and one with pack: auto sized by the GPU's
# memory, each checked from Optuna and MLflow (every trial's run records a CUDA device), into
# $OUT/gpu_study.json; and benchmarks/pack_baselines.py (the pack against hand-written
# torch.func loops, plain and as a CUDA graph) into $OUT/pack_baselines_cuda.json.
set -euo pipefail
WHEELS=${WHEELS:-.whl}
SITE=${SITE:-/tmp/fedtune-gpu-site}
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
python3 tools/gpu_wheels.py assemble "$WHEELS" /tmp/fedtune-gpu-wheels
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" /tmp/fedtune-gpu-wheels/*.whl
export PYTHONPATH=$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MPLBACKEND=Agg
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c 'import torch, ray, optuna, mlflow; print("torch", torch.__version__, "cuda",
    torch.version.cuda, "ray", ray.__version__, "optuna", optuna.__version__, "mlflow",
    mlflow.__version__)'
status=0
timeout "${STUDY_LIMIT:-300}" python3 benchmarks/gpu_study.py --device cuda \
    --out "$OUT/gpu_study.json" || status=$?
timeout "${BASELINES_LIMIT:-200}" python3 benchmarks/pack_baselines.py --device cuda \
    --sizes 1,64,256,1024 --target 1.0 --out "$OUT/pack_baselines_cuda.json" \
    || echo "pack_baselines.py --device cuda: exit $?"
exit "$status"
