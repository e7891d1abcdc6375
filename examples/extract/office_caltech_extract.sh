#!/usr/bin/env bash
# Extract Office-Caltech10 features (frozen EfficientNet-Lite0, builtin ImageNet weights).
# Usage: examples/extract/office_caltech_extract.sh [DATA=../shared/data] [OUT=features/office_caltech10]
# Writes OUT/{amazon,caltech10,dslr,webcam}.h5 and touches OUT/<domain>.done when each is complete.
set -euo pipefail
DATA=${1:-../shared/data}
OUT=${2:-features/office_caltech10}
mkdir -p "$OUT"
for d in dslr webcam amazon caltech10; do
  if [ -e "$OUT/$d.done" ]; then echo "$d: done already"; continue; fi
  start=$(date +%s)
  fedalign extract "$DATA/office_caltech10/images/$d" -o "$OUT/$d.h5" --weights builtin
  echo "$d: $(( $(date +%s) - start )) s"
  touch "$OUT/$d.done"
done
