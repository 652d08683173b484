#!/usr/bin/env bash
# Create .venv (if missing) and install opscope with the CPU build of torch.
# TORCH_SPEC overrides the torch requirement (e.g. TORCH_SPEC="torch==2.5.1" for a CUDA box).
# EXTRAS picks optional dependencies (default: none; the test script asks for test,onnx,xlsx,peers,dask).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
target="."
[ -n "${EXTRAS:-}" ] && target=".[${EXTRAS}]"
.venv/bin/python -m pip install -q "$TORCH_SPEC" -e "$target"
# The native aten observer of opscope.watch links the installed torch: build it now (once
# per torch version, a few seconds) rather than at the first watch. Without a compiler
# opscope still works (watch then uses a slower Python dispatch mode).
.venv/bin/python -m opscope.capture.torch.native.build || echo "opscope: continuing without the native observer" >&2
