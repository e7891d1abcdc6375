#!/usr/bin/env bash
# Both methods across sites on Flower's deployment engine, all on this machine:
# a SuperLink and N SuperNodes on 127.0.0.1 (free ports), the SLOT-Align run, then the
# DeFed-GMM-DaDiL run, on the quick-start data (scikit-learn digits in three styles); the same
# federation through the file pipeline (fedalign's subcommands); both accuracy tables; the
# comparison (reference to 1e-8, equal accuracies, equal DaDiL states and atoms); the bytes
# each client sent and received. Every process it starts is stopped at the end, also on an
# error or Ctrl-C.
#
#   examples/flower/run_local.sh 3          # N = 2 or 3 sites (the quick start has 3 domains)
#
# Needs `pip install -e '.[flower]'` (fedalign, flwr, flower-superlink, flower-supernode on
# PATH). Environment (all optional): OUT (default examples/flower/out), FEATURES (a folder
# with ink.h5 neon.h5 blocky.h5 from an earlier quick start: skips rendering and extraction),
# SEEDS (0-2), ROUNDS (4), LOCAL_STEPS (5), STRATEGY (aggregation), HEADS.
# Outputs under OUT: data/ (the sites' files), files/ (file pipeline), flower/ (the ServerApp:
# ref.npz, slot.json, defed-STRATEGY.json), nodes/SITE/ (each SuperNode's private folder),
# logs/. Exit status: 0 when both pipelines agree, 1 when they differ, 2 on bad usage.
set -euo pipefail

N=${1:-3}
case "$N" in
  2|3) ;;
  *) echo "error: N must be 2 or 3 (the quick-start data has 3 domains), got '$N'" >&2; exit 2 ;;
esac
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${OUT:-$HERE/out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
SEEDS=${SEEDS:-0-2}
ROUNDS=${ROUNDS:-4}
LOCAL_STEPS=${LOCAL_STEPS:-5}
STRATEGY=${STRATEGY:-aggregation}
HEADS=${HEADS:-fedcgs,fedpft,fed3r,ofedavg}
PARAMS="ofedavg.epochs=10 fedpft.epochs=10"   # the quick start's
TARGET=ink
if [ "$N" = 3 ]; then SITES="blocky ink neon"; else SITES="ink neon"; fi   # sorted: client order
for tool in fedalign flwr flower-superlink flower-supernode python; do
  command -v "$tool" >/dev/null || { echo "error: $tool not found: pip install -e '.[flower]'" >&2; exit 2; }
done
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}   # the same threads in both pipelines: equal floats
D=$OUT/data; LOGS=$OUT/logs
rm -rf "$OUT/files" "$OUT/flower" "$OUT/nodes" "$LOGS"
mkdir -p "$D" "$OUT/files" "$OUT/flower" "$OUT/nodes" "$LOGS"
T0=$SECONDS

# ------------------------------------------------------------------ processes and cleanup
# Each Flower process runs in its own session and carries TOKEN in its environment; Flower's
# own subprocesses (flower-superexec, flwr-serverapp, flwr-clientapp) inherit it, so cleanup
# finds them even where Flower detached them from their parent.
export FLWR_HOME=$OUT/flwr-home               # Flower's connection settings and installed apps
rm -rf "$FLWR_HOME"; mkdir -p "$FLWR_HOME"
TOKEN="fedalign-run-local-$$-$RANDOM$RANDOM"
PIDS=()
marked() {
  local e p
  for e in /proc/[0-9]*/environ; do
    p=${e#/proc/}; p=${p%/environ}
    [ "$p" = "$$" ] && continue
    { tr '\0' '\n' < "$e"; } 2>/dev/null | grep -qx "FEDALIGN_FLOWER_TOKEN=$TOKEN" && echo "$p"
  done
  return 0
}
cleanup() {
  local status=$? p i
  trap - EXIT INT TERM
  for p in "${PIDS[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
  for p in $(marked); do kill -TERM "$p" 2>/dev/null || true; done
  for i in $(seq 50); do [ -z "$(marked)" ] && break; sleep 0.2; done
  for p in $(marked); do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  [ "${#PIDS[@]}" -gt 0 ] && echo "run_local: stopped the SuperLink and $(( ${#PIDS[@]} - 1 )) SuperNodes"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
start() {  # start LOG COMMAND…: in its own session, marked, logging to logs/LOG
  local log=$1; shift
  FEDALIGN_FLOWER_TOKEN=$TOKEN setsid "$@" > "$LOGS/$log" 2>&1 < /dev/null &
  PIDS+=("$!")
}
free_port() { python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'; }
wait_port() {  # wait_port PORT PID
  local i
  for i in $(seq 600); do
    kill -0 "$2" 2>/dev/null || { echo "error: the SuperLink exited; see $LOGS/superlink.log" >&2; tail -5 "$LOGS/superlink.log" >&2; exit 1; }
    python -c "import socket, sys; socket.create_connection(('127.0.0.1', $1), 0.5).close()" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "error: nothing listens on 127.0.0.1:$1" >&2; exit 1
}
say() { printf '\n== %s (%ds)\n' "$*" $(( SECONDS - T0 )); }

# ------------------------------------------------------------------ the sites' data
say "quick-start data: $SITES (target $TARGET) → $D"
mkdir -p "$D/features" "$D/gmm"
for c in ink neon blocky; do
  [ -f "$D/features/$c.h5" ] && continue
  if [ -n "${FEATURES:-}" ]; then
    cp "$FEATURES/$c.h5" "$D/features/$c.h5"
  else
    [ -f "$D/images/.done" ] || { fedalign demo-data "$D/images" --per-domain 150 --size 32 && touch "$D/images/.done"; }
    fedalign extract "$D/images/$c" -o "$D/features/$c.h5" --weights builtin --image-size 96
  fi
done
rm -rf "$D/clients" "$D/split"
fedalign partition $(for c in $SITES; do echo "$D/features/$c.h5"; done) -o "$D/clients" --alpha 0.5 --seed 0 > "$LOGS/partition.txt"
fedalign partition "$D/features/$TARGET.h5" -o "$D/split" --alpha none --test-fraction 0.2 --seed 0 > /dev/null
for c in $SITES; do   # each site fits its private GMM (the target: unlabeled, its adaptation split)
  if [ "$c" = "$TARGET" ]; then
    fedalign fit-gmm "$D/split/$c.c0.train.h5" --unlabeled -k 2 -o "$D/gmm/$c.gmm.npz" 2>/dev/null
  else
    fedalign fit-gmm "$D/features/$c.h5" -k 2 -o "$D/gmm/$c.gmm.npz" 2>/dev/null
  fi
done

# ------------------------------------------------------------------ the file pipeline
say "file pipeline → $OUT/files"
F=$OUT/files
for c in $SITES; do fedalign stats "$D/clients/$c.c0.train.h5" -o "$F/$c.stats.npz" 2>/dev/null; done
fedalign barycenter $(for c in $SITES; do echo "$F/$c.stats.npz"; done) -o "$F/ref.npz"
for c in $SITES; do
  fedalign align --tau 0.4 "$D/clients/$c.c0.train.h5" "$F/ref.npz" --stats "$F/$c.stats.npz" \
      -o "$F/$c.c0.train.h5" --save-map "$F/$c.map.npz" 2>/dev/null
  fedalign align --tau 0.4 --map "$F/$c.map.npz" "$D/clients/$c.test.h5" -o "$F/$c.test.h5" 2>/dev/null
done
fedalign evaluate $(echo "$HEADS" | tr ',' '\n' | sed 's/^/-m /') $(for p in $PARAMS; do echo "--param $p"; done) \
    --seeds "$SEEDS" --train $(for c in $SITES; do echo "$F/$c.c0.train.h5"; done) \
    --test $(for c in $SITES; do echo "$F/$c.test.h5"; done) --json "$F/slot.json" > "$LOGS/files-slot.txt"
FED=$F/$STRATEGY
mkdir -p "$FED/state" "$FED/round_000"
for c in $SITES; do
  fedalign dadil-round --init --client "$c" --gmm "$D/gmm/$c.gmm.npz" --n-components 20 \
      --state "$FED/state/$c.state.npz" -o "$FED/round_000/$c.atoms.npz" 2>/dev/null
done
for t in $(seq 1 "$ROUNDS"); do
  prev=$(printf "$FED/round_%03d" $((t - 1))); cur=$(printf "$FED/round_%03d" "$t"); mkdir -p "$cur"
  for c in $SITES; do
    fedalign dadil-round --state "$FED/state/$c.state.npz" --client "$c" --strategy "$STRATEGY" \
        --local-steps "$LOCAL_STEPS" -o "$cur/$c.atoms.npz" "$prev"/*.atoms.npz 2>/dev/null
  done
done
fedalign dadil-evaluate --test "$D/split/$TARGET.test.h5" --state "$STRATEGY=$FED/state/$TARGET.state.npz" \
    --seeds "$SEEDS" --json "$F/defed-$STRATEGY.json" > "$LOGS/files-defed.txt"
T_FILES=$(( SECONDS - T0 ))

# ------------------------------------------------------------------ Flower: SuperLink + N SuperNodes
say "Flower: a SuperLink and $N SuperNodes on 127.0.0.1"
PORT=$(free_port)
start superlink.log flower-superlink --insecure --host 127.0.0.1 --port "$PORT" \
    --disable-runtime-dependency-installation
wait_port "$PORT" "${PIDS[0]}"
for c in $SITES; do
  NC="name='$c' dir='$OUT/nodes/$c' train='$D/clients/$c.c0.train.h5' test='$D/clients/$c.test.h5' gmm='$D/gmm/$c.gmm.npz'"
  [ "$c" = "$TARGET" ] && NC="$NC dadil-test='$D/split/$TARGET.test.h5'"
  start "supernode-$c.log" flower-supernode --insecure --superlink "127.0.0.1:$PORT" \
      --host 127.0.0.1 --port "$(free_port)" --node-config "$NC"
done
printf '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "127.0.0.1:%s"\ninsecure = true\n' \
    "$PORT" > "$FLWR_HOME/config.toml"
flower_run() {  # flower_run NAME REPORT RUN-CONFIG: one run, streamed to logs/flwr-NAME.log
  local name=$1 report=$2 t=$SECONDS; shift 2
  flwr run "$HERE" local --stream --run-config "$*" > "$LOGS/flwr-$name.log" 2>&1 || true
  grep -E "INFO|WARNING|ERROR" "$LOGS/flwr-$name.log" | grep -vE "Start|logstream|installed" \
      | sed 's/^.*:      /  /' || true
  if [ ! -f "$report" ]; then
    echo "error: the $name run wrote no $(basename "$report"); see $LOGS/flwr-$name.log" >&2; exit 1
  fi
  echo "  ($name run: $(( SECONDS - t )) s)"
}
T1=$SECONDS
say "Flower run 1: SLOT-Align ($HEADS, seeds $SEEDS)"
flower_run slot "$OUT/flower/slot.json" \
    "method='slot' out='$OUT/flower' heads='$HEADS' seeds='$SEEDS' params='$PARAMS' clients=$N"
T_SLOT=$(( SECONDS - T1 )); T1=$SECONDS
say "Flower run 2: DeFed-GMM-DaDiL ($STRATEGY, $ROUNDS rounds)"
flower_run defed "$OUT/flower/defed-$STRATEGY.json" \
    "method='defed' out='$OUT/flower' strategy='$STRATEGY' rounds=$ROUNDS local-steps=$LOCAL_STEPS n-components=20 eval-seeds='$SEEDS' fresh=true clients=$N"
T_DEFED=$(( SECONDS - T1 ))

# ------------------------------------------------------------------ tables and comparison
say "accuracy: SLOT-Align, Flower and file pipeline (macro %)"
fedalign report "$OUT/flower/slot.json" "$F/slot.json" --label flower --label files
say "accuracy: DeFed-GMM-DaDiL target $TARGET, Flower and file pipeline"
fedalign report "$OUT/flower/defed-$STRATEGY.json" "$F/defed-$STRATEGY.json" --label flower --label files
say "comparison"
set +e
python -m fedalign.flower.compare --ref "$OUT/flower/ref.npz" "$F/ref.npz" \
    --slot "$OUT/flower/slot.json" "$F/slot.json" \
    $(for c in $SITES; do echo "--defed $OUT/nodes/$c/dadil/$STRATEGY $FED"; done) \
    --comm "$OUT/flower/slot.json" "$OUT/flower/defed-$STRATEGY.json"
STATUS=$?
set -e
printf '\nrun_local: %d s in all (data and file pipeline %d s, Flower SLOT run %d s, DeFed run %d s)\n' \
    $(( SECONDS - T0 )) "$T_FILES" "$T_SLOT" "$T_DEFED"
[ "$STATUS" = 0 ] && echo "run_local: the Flower runs equal the file pipeline" \
                  || echo "run_local: the Flower runs DIFFER from the file pipeline" >&2
exit "$STATUS"
