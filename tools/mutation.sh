#!/usr/bin/env bash
# Mutation testing of fedalign's core modules with mutmut 3 (see docs/mutation.md).
#
#   tools/mutation.sh                 # every core module, each with its own fast test selection
#   tools/mutation.sh align heads     # only these modules (names from the table below)
#   MUTMUT="python -m mutmut" JOBS=2 tools/mutation.sh align
#   RECHECK=1 tools/mutation.sh align # after adding tests: re-test only the mutants an earlier
#                                     # run left alive, with the current tests and selection
#
# Each module is mutated in a scratch copy of the repository (WORK, default
# /tmp/fedalign-mutation/<module>), never in the working tree: other people's edits are safe
# and the working tree never holds a mutant. Results: WORK/<module>/mutmut-results.txt.
set -euo pipefail

ROOT="${ROOT:-$(cd "$(dirname "$0")/.." && pwd)}"
WORK="${WORK:-/tmp/fedalign-mutation}"
MUTMUT="${MUTMUT:-mutmut}"
JOBS="${JOBS:-1}"
RECHECK="${RECHECK:-0}"
PYTHON="${PYTHON:-python}"

# module name | files to mutate (comma separated) | pytest selection (a fast subset that guards it)
MODULES=(
  "gaussian|fedalign/gaussian.py|tests/test_gaussian.py tests/test_gaussian_mutants.py"
  "bures|fedalign/_bures_fixed_point.py|tests/test_gaussian.py tests/test_gaussian_mutants.py tests/test_backend.py"
  "align|fedalign/align.py|tests/test_align.py tests/test_behaviours_slot.py tests/test_slot_protocol.py tests/test_align_mutants.py"
  "heads|fedalign/heads/|tests/test_heads.py tests/test_behaviours_slot.py tests/test_slot_variants.py tests/test_heads_training.py tests/test_heads_statistics.py tests/test_dp.py"
  "distances|fedalign/dadil/distances.py|tests/test_dadil_distances.py"
  "barycenter|fedalign/dadil/barycenter.py|tests/test_dadil_barycenter.py tests/test_behaviours_dadil.py"
  "gossip|fedalign/dadil/gossip.py|tests/test_dadil_gossip.py tests/test_behaviours_dadil.py tests/test_dadil_gossip_files.py"
  "state|fedalign/dadil/state.py|tests/test_dadil_gossip.py tests/test_behaviours_dadil.py tests/test_files_features.py tests/test_files_npz.py tests/test_files_outputs.py tests/test_files_reports.py tests/test_files_transactions.py tests/test_dadil_gossip_files.py tests/test_dadil_state.py"
)

write_config() {  # $1 = scratch folder, $2 = files to mutate, $3 = test selection
  {
    echo "[mutmut]"
    echo "source_paths="
    echo "    fedalign/"
    echo "only_mutate="
    tr ',' '\n' <<<"$2" | sed -e 's#/$#/*#' -e 's/^/    /'
    echo "pytest_add_cli_args_test_selection="
    for t in $3; do echo "    $t"; done
    echo "pytest_add_cli_args="
    echo "    -q"
    echo "    -p"
    echo "    no:cacheprovider"
  } >"$1/setup.cfg"
}

summary() {  # counts of mutmut-results.txt in the current folder
  $PYTHON - <<'PY'
import collections, re
from pathlib import Path
txt = Path("mutmut-results.txt").read_text() if Path("mutmut-results.txt").exists() else ""
c = collections.Counter(m.group(1) for m in re.finditer(r":\s*(\w[\w ]*)$", txt, re.M))
n = sum(c.values())
print(f"   {dict(c)}; killed {c.get('killed', 0)}/{n}" if n else "   no results (see mutants/)")
PY
}

want=("$@")
for row in "${MODULES[@]}"; do
  IFS='|' read -r name files tests <<<"$row"
  if [ ${#want[@]} -gt 0 ] && [[ ! " ${want[*]} " =~ " ${name} " ]]; then continue; fi
  dst="$WORK/$name"
  if [ "$RECHECK" = 1 ]; then
    if [ ! -f "$dst/mutmut-results.txt" ]; then
      echo "== $name: no earlier run in $dst: run it without RECHECK first"; continue
    fi
    # the current package, tests and project file (times kept: mutmut regenerates the mutants
    # of functions whose source changed since the run and tests those afresh)
    (cd "$ROOT" && tar cf - --exclude='__pycache__' --exclude='*.pyc' fedalign tests pyproject.toml) \
      | (cd "$dst" && tar xf -)
    write_config "$dst" "$files" "$tests"
    mapfile -t again < <(grep -v ': killed$' "$dst/mutmut-results.txt" | sed -e 's/^ *//' -e 's/:[^:]*$//')
    echo "== $name: re-testing ${#again[@]} mutants not killed before (and those of changed code), against: $tests"
    (cd "$dst" && OMP_NUM_THREADS=1 MPLBACKEND=Agg $MUTMUT run --max-children "$JOBS" || true)
    if [ ${#again[@]} -gt 0 ]; then
      (cd "$dst" && OMP_NUM_THREADS=1 MPLBACKEND=Agg $MUTMUT run --max-children "$JOBS" "${again[@]}" || true)
    fi
    (cd "$dst" && $MUTMUT results --all true >mutmut-results.txt || true)
    (cd "$dst" && summary)
    continue
  fi
  rm -rf "$dst" && mkdir -p "$dst"
  # a clean copy: the package, the tests, the project file (no caches, no outputs)
  (cd "$ROOT" && tar cf - --exclude='__pycache__' --exclude='*.pyc' fedalign tests pyproject.toml) \
    | (cd "$dst" && tar xf -)
  write_config "$dst" "$files" "$tests"
  echo "== $name: mutating $files against: $tests"
  (cd "$dst" && OMP_NUM_THREADS=1 MPLBACKEND=Agg $MUTMUT run --max-children "$JOBS" \
     && $MUTMUT results --all true >mutmut-results.txt || true)
  (cd "$dst" && summary)
done
