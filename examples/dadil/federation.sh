#!/usr/bin/env bash
# One DeFed-GMM-DaDiL federation driven only by fedalign subcommands and files.
# Usage: federation.sh FEATURES_DIR OUT TARGET ROUNDS LOCAL_STEPS DOMAIN...
# Every domain is one client; TARGET is unlabeled and keeps a 20% test split it never adapts on.
set -euo pipefail
FEAT=$1 OUT=$2 TARGET=$3 ROUNDS=$4 E=$5
shift 5
DOMAINS=("$@")
mkdir -p "$OUT/split"

# 1. the target's stratified 20% test split (never used for adaptation)
fedalign partition "$FEAT/$TARGET.h5" -o "$OUT/split" --alpha none --test-fraction 0.2 --seed 0

# 2. every client fits its private GMM (sources labeled, the target unlabeled)
for d in "${DOMAINS[@]}"; do
  if [ "$d" = "$TARGET" ]; then
    fedalign fit-gmm "$OUT/split/$TARGET.c0.train.h5" --unlabeled -o "$OUT/$d.gmm.npz"
  else
    fedalign fit-gmm "$FEAT/$d.h5" -o "$OUT/$d.gmm.npz"
  fi
done

# 3. gossip: --init, then ROUNDS synchronous rounds; round t reads the atoms of round t-1
for strategy in replacement aggregation; do
  F="$OUT/$strategy"
  mkdir -p "$F/state" "$F/round_000"
  for d in "${DOMAINS[@]}"; do
    fedalign dadil-round --init --force --client "$d" --gmm "$OUT/$d.gmm.npz" \
      --state "$F/state/$d.state.npz" -o "$F/round_000/$d.atoms.npz"
  done
  for t in $(seq 1 "$ROUNDS"); do
    prev=$(printf "%s/round_%03d" "$F" $((t - 1)))
    cur=$(printf "%s/round_%03d" "$F" "$t")
    mkdir -p "$cur"
    for d in "${DOMAINS[@]}"; do
      fedalign dadil-round --state "$F/state/$d.state.npz" --client "$d" --strategy "$strategy" \
        --local-steps "$E" -o "$cur/$d.atoms.npz" "$prev"/*.atoms.npz
    done
  done
done

# 4. consensus curves and the target's accuracy next to the baselines
fedalign consensus replacement="$OUT/replacement" aggregation="$OUT/aggregation" \
  -o "$OUT/consensus.json" --plot "$OUT/consensus.png"
fedalign evaluate --method dadil --input "$OUT/aggregation/state/$TARGET.state.npz" \
  --test "$OUT/split/$TARGET.test.h5" --json "$OUT/evaluate.json"
SRC=() GMMS=()
for d in "${DOMAINS[@]}"; do
  [ "$d" = "$TARGET" ] && continue
  SRC+=(--source "$FEAT/$d.h5"); GMMS+=(--gmm "$OUT/$d.gmm.npz")
done
fedalign dadil-evaluate --test "$OUT/split/$TARGET.test.h5" "${SRC[@]}" "${GMMS[@]}" \
  --target-gmm "$OUT/$TARGET.gmm.npz" --state replacement="$OUT/replacement/state/$TARGET.state.npz" \
  --state aggregation="$OUT/aggregation/state/$TARGET.state.npz" --json "$OUT/dadil-evaluate.json"
