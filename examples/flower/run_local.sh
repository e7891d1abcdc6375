#!/usr/bin/env bash
# Both methods across sites on Flower's deployment engine, all on this machine, on the quick
# start's data (scikit-learn digits in three styles): examples/flower/launch.py does the work
# (partition, a SuperLink and N SuperNodes on 127.0.0.1, SLOT-Align and DeFed-GMM-DaDiL, the
# same federation through the file pipeline, the comparison; every process stopped at the
# end, also on an error or Ctrl-C). This wrapper keeps the environment variables of the
# earlier script:
#
#   examples/flower/run_local.sh 3          # any N ≥ 2 (N > 3: several clients per domain)
#
# Environment (all optional): OUT (default examples/flower/out), FEATURES (a folder with
# ink.h5 neon.h5 blocky.h5 from an earlier quick start: skips rendering and extraction),
# SEEDS (0-2), ROUNDS (4), LOCAL_STEPS (5), STRATEGY (aggregation), HEADS. Other launcher
# options after N (python examples/flower/launch.py --help). Exit status: 0 when both
# pipelines agree, 1 when they differ, 2 on bad usage.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
N=${1:-3}
[ $# -gt 0 ] && shift
FILES=()
if [ -n "${FEATURES:-}" ]; then FILES=("$FEATURES/blocky.h5" "$FEATURES/ink.h5" "$FEATURES/neon.h5"); fi
exec python "$HERE/launch.py" -n "$N" ${FILES[@]+"${FILES[@]}"} --target ink \
    -o "${OUT:-$HERE/out}" --seeds "${SEEDS:-0-2}" --rounds "${ROUNDS:-4}" \
    --local-steps "${LOCAL_STEPS:-5}" --strategy "${STRATEGY:-aggregation}" \
    --heads "${HEADS:-fedcgs,fedpft,fed3r,ofedavg}" "$@"
