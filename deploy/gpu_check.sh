#!/usr/bin/env bash
# The GPU checks on a bare GPU machine that reaches no network, in one go and inside a
# time budget: build mamba-ssm's and causal-conv1d's CUDA kernels for one architecture,
# run the `gpu` tests, then `dygserve bench gpu` on a copy of docs/BENCHMARKS.md.
#
#   OUT=/some/dir bash deploy/gpu_check.sh [ARCH]      (from the repo root; ARCH: 9.0)
#
# KERNELS="mamba_ssm" builds only mamba-ssm (causal-conv1d's build took over 330 s on 16
# cores, and without it the conv runs in torch); BENCH=0 skips the bench; PROFILE=1 runs
# `python -m loadtests.gpu_profile` (ingest and cold rebuild by operator) as soon as
# mamba-ssm is built, while causal-conv1d's build goes on.
#
# Needs, in the ignored folder .whl (docs/BENCHMARKS.md, "Commands for the device
# machine", says how to fill it here): the service's pure-Python wheels, the two sdists in
# .whl/src and the UCI and MOOC streams in .whl/data. The machine's own python3 must hold
# torch with CUDA, nvcc, ninja, triton, einops and transformers. Each step gets what is
# left of GPU_CHECK_BUDGET_S (the caller's limit, less a margin), so a slow build costs
# the bench rather than every result; logs and the filled BENCHMARKS.md land in $OUT.
set -uo pipefail
R=$PWD
ARCH=${1:-9.0}
OUT=${OUT:-/tmp/gpu-check}
BUDGET=${GPU_CHECK_BUDGET_S:-540}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 DYGSERVE_DATA=$R/.whl/data
left() { echo $((BUDGET - SECONDS)); }
log() { echo "[${SECONDS}s] $*" | tee -a "$OUT/steps.log"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$R"/.whl/*.whl
export PYTHONPATH=/tmp/site:/tmp/site-mamba_ssm:/tmp/site-causal_conv1d:$R
log "wheels installed; torch $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda)')"

# Both builds at once: each is bound by its slowest file, and 16 cores cover both.
mkdir -p /tmp/kb && (cd /tmp/kb && for f in "$R"/.whl/src/*.tar.gz; do tar xzf "$f"; done)
python3 "$R/deploy/kernel_arches.py" "$ARCH" /tmp/kb/mamba_ssm-*/setup.py /tmp/kb/causal_conv1d-*/setup.py
KERNELS=${KERNELS:-causal_conv1d mamba_ssm}
BENCH=${BENCH:-1}
PROFILE=${PROFILE:-0}
build_budget=$(($(left) - (BENCH ? 200 : 90)))
declare -A build_pid
for pkg in $KERNELS; do
    (MAX_JOBS=16 MAMBA_FORCE_BUILD=TRUE CAUSAL_CONV1D_FORCE_BUILD=TRUE timeout "$build_budget" \
        python3 -m pip install --no-index --no-deps --no-build-isolation --target "/tmp/site-$pkg" \
        /tmp/kb/$pkg-* >"$OUT/build-$pkg.log" 2>&1
     log "$pkg build rc=$?") &
    build_pid[$pkg]=$!
done
if [ "$PROFILE" = 1 ] && [ -n "${build_pid[mamba_ssm]:-}" ]; then
    wait "${build_pid[mamba_ssm]}"
    log "profile (causal-conv1d's build, if any, goes on)"
    timeout $(($(left) < 300 ? $(left) / 2 : 150)) python3 -m loadtests.gpu_profile \
        --data .whl/data/uci --out "$OUT" 2>&1 | grep -v '^USDT' > "$OUT/gpu-profile.log"
    log "profile rc=${PIPESTATUS[0]}"
fi
wait
python3 -c 'from model.kernels.ops import load_mamba_ops; print(load_mamba_ops())' 2>&1 | tail -1 \
    | tee -a "$OUT/steps.log"

log "gpu tests"
test_budget=$((BENCH ? ($(left) < 320 ? $(left) / 2 : 160) : $(left) - 5))
timeout "$test_budget" python3 -m pytest -q -ra -s -m gpu -p no:cacheprovider \
    tests/model/kernels/test_cuda_kernels.py tests/service/test_device.py \
    tests/model/onnx/test_onnx.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -25
log "gpu tests rc=${PIPESTATUS[0]}"

[ "$BENCH" = 1 ] || exit 0
cp docs/BENCHMARKS.md "$OUT/"
timeout $(($(left) - 5)) python3 -m loadtests.gpu_bench --doc "$OUT/BENCHMARKS.md" \
    --data .whl/data --cpu-max-events 500000 2>&1 | tee "$OUT/gpu-bench.log" | grep -v '^|'
log "bench rc=${PIPESTATUS[0]}"
