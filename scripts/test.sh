#!/usr/bin/env bash
# Install opscope with its test extras into .venv, make sure a headless Chromium is present
# for the HTML report tests, lint and type-check, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=${EXTRAS:-test,onnx,xlsx,peers,dask,integrations,tensorboard} bash scripts/install.sh
# TensorFlow for the TF tests (tests/integration/test_tf_*.py), pinned like torch: the CPU build
# (~80 s, beside torch in one venv). opscope[tensorflow] asks for "tensorflow>=2.16" for users.
.venv/bin/python -m pip install -q "${TF_SPEC:-tensorflow-cpu==2.21.0}"
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "warning: could not install chromium; HTML tests will fail" >&2
  else
    echo "warning: chromium not found (apt-get install chromium); HTML tests will fail" >&2
  fi
fi
.venv/bin/ruff check src tests benchmarks
.venv/bin/mypy  # the package, as configured in pyproject.toml's [tool.mypy]
# The tests in parallel, one file per worker (module fixtures are built once), up to 4 workers
# (each holds torch and TensorFlow); PYTEST_WORKERS=0 runs them in this process.
# CI's budget is 20 minutes on 2 cores, installs included. A Python process that imports torch
# and transformers, or TensorFlow, spends ~6 s before it runs anything, so fixtures that train
# several runs do them in one process where they can (real_distributed.py, tf_train.py --runs).
WORKERS=${PYTEST_WORKERS:-$(( $(nproc) < 4 ? $(nproc) : 4 ))}
exec .venv/bin/python -m pytest -n "$WORKERS" --dist loadfile "$@"
