#!/usr/bin/env bash
# Extract a stratified 100-per-class subsample of each digits domain (builtin EfficientNet-Lite0).
# Usage: examples/extract/digits_extract.sh [DATA=../shared/data] [OUT=features/digits]
set -euo pipefail
DATA=${1:-../shared/data}
OUT=${2:-features/digits}
mkdir -p "$OUT/lists"
python "$(dirname "$0")/digits_subsample.py" "$DATA/digits" -o "$OUT/lists" --per-class 100
for d in mnist usps mnistm; do
  if [ -e "$OUT/$d.done" ]; then echo "$d: done already"; continue; fi
  start=$(date +%s)
  fedalign extract "$OUT/lists/$d.csv" --root "$DATA/digits/$d" -o "$OUT/$d.h5" --weights builtin
  echo "$d: $(( $(date +%s) - start )) s"
  touch "$OUT/$d.done"
done
