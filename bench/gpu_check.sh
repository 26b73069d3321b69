#!/usr/bin/env bash
# The CUDA checks of the GPU and precision work in one run, for a lent GPU machine
# (../shared/gpu/README.md: `bash ../shared/gpu/prepare.sh` here fills .gpu/ first; then the
# device tool runs `bash bench/gpu_check.sh` with carry [".gpu"] and a timeout of about 600 s).
#
# Parts, each under its own timeout, each logged to $OUT/<part>.log, one line per part
# (exit status, seconds) in $OUT/summary.txt:
#   cuda_tests    tests/train/test_cuda_paths.py: the fused exact-reduction kernels against the
#                 numpy ones, a CUDA rank's determinism, 1 cell == 2 cells sharing the GPU,
#                 FT114 exact on CUDA, the default `ftkit train --device cuda` on one GPU PASS
#   fingerprints  tests/tensors/test_fingerprint*.py on the GPU (CUDA == CPU in both schemes), then
#                 bench/fingerprint.py --device cuda: ftkit-fp2 on the GPU (target >= 200 GB/s)
#   exact_reduce  bench/exact_reduce.py: the exact reduction against the float one (target <= 2x)
#   precision     bench/precision.py: step time and memory, bf16 against fp32
#   train_cuda    the README's main job on the GPU: `ftkit train --device cuda`, then its forensics
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
if [ -f .gpu/env.sh ]; then
  # shellcheck disable=SC1091
  source .gpu/env.sh
fi

part() {
  local name=$1 limit=$2 start rc
  shift 2
  start=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  echo "$name rc=$rc $(($(date +%s) - start))s" | tee -a "$OUT/summary.txt"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt" 2>&1
part cuda_tests 240 python3 -m pytest -q -x -p no:cacheprovider tests/train/test_cuda_paths.py
part fingerprints 90 bash -c "python3 -m pytest -q -x -p no:cacheprovider tests/tensors/test_fingerprint.py \
  tests/tensors/test_fingerprint_fp2.py && python3 bench/fingerprint.py --device cuda --size 4096"
part exact_reduce 90 python3 bench/exact_reduce.py --device cuda --scale 1
part precision 120 python3 bench/precision.py --models small --device cuda
part train_cuda 150 python3 -m ftkit train --out runs/gpu-check --overwrite --device cuda
