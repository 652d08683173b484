#!/usr/bin/env bash
# The checks that need a GPU, as one short script (a few minutes on one CUDA device), for a
# machine where one is lent: the native dump's device statistics against the C kernel's, the
# whole-suite tests marked for CUDA, and what a dumped step costs on the device. Run from the
# repository root after scripts/install.sh (with a CUDA build of torch: TORCH_SPEC).
#
#   bash scripts/device_check.sh [OUT]        # OUT: folder for the logs (default device-check/)
set -uo pipefail
OUT="${1:-device-check}"
PY="${PYTHON:-.venv/bin/python}"
mkdir -p "$OUT"
"$PY" - <<'EOF' | tee "$OUT/device.txt"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0))
EOF
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || {
    echo "no CUDA device: nothing to check here" | tee -a "$OUT/device.txt"; exit 1; }
"$PY" -m opscope.capture.torch.native.build 2>&1 | tee "$OUT/build.txt"
rc=0
"$PY" -m pytest -q -p no:cacheprovider tests/unit/dump/test_dump_native_device.py -k cuda 2>&1 \
    | tee "$OUT/tests.txt" | tail -5 || rc=1
for task in tiny transformer; do
    timeout 300 "$PY" benchmarks/bench_device_stats.py --device cuda --task "$task" --steps 20 --rounds 3 2>&1 \
        | tee "$OUT/bench_$task.txt" || rc=1
done
exit $rc
