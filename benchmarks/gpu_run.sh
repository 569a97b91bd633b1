#!/usr/bin/env bash
# One call on a lent GPU machine (the device tool): the CUDA tests, then benchmarks/speed.py --device cuda.
# Everything it prints also lands in $OUT (or ./gpu_out).  Usage: bash benchmarks/gpu_run.sh [SECTIONS] [SECONDS]
set -u
out=${OUT:-gpu_out}
mkdir -p "$out"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
sections=${1:-linear,gpt,mlp,resnet20}
families=${FAMILIES:-fp32,bf16,int8,int8_df}
seconds=${2:-1}
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv; lscpu | grep 'Model name'
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } 2>&1 | tee "$out/machine.txt"
timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -q --tb=short -p no:cacheprovider -m cuda \
    tests/kernels/test_cuda_kernels.py tests/nn/test_cuda_training.py tests/kernels/test_matmul.py \
    tests/kernels/test_conv_generic.py 2>&1 | tee "$out/cuda_tests.log" | tail -n 40
timeout "${SPEED_TIMEOUT:-380}" python3 benchmarks/speed.py --device cuda --only "$sections" \
    --families "$families" --seconds "$seconds" --json "$out/speed_cuda.json" 2>&1 | tee "$out/speed_cuda.md"
timeout "${PROFILE_TIMEOUT:-60}" python3 benchmarks/cuda_profile.py 2>&1 | tee "$out/cuda_profile.txt" | grep -v "^-" | cut -c1-150
