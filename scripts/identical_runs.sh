#!/bin/bash
# Toy, math and search evaluations with tiny-random, small and seeded, into OUT/{toy,math,search}:
# the fixed runs that scripts/check_identical_runs.py compares before and after a refactor.
#   bash scripts/identical_runs.sh /tmp/before && (change code) && bash scripts/identical_runs.sh /tmp/after
#   python scripts/check_identical_runs.py /tmp/before/toy /tmp/after/toy /tmp/before/math /tmp/after/math \
#       /tmp/before/search /tmp/after/search
# Needs DRMAS_DATA_DIR (math/aime24, qa/hotpotqa, corpus/mini_corpus.jsonl) and the prepared tiny-random.
set -euo pipefail
O=${1:?usage: identical_runs.sh OUT}
PY=${PYTHON:-python}
common=(--model tiny-random --n 2 --seed 1 --max-new-tokens 16 --fresh --no-progress)
$PY -m drmas_bench -q eval "${common[@]}" --suite toy --limit 3 --out "$O/toy"
$PY -m drmas_bench -q eval "${common[@]}" --suite math --benchmarks aime24 --limit 2 --out "$O/math"
$PY -m drmas_bench -q eval "${common[@]}" --suite search --benchmarks hotpotqa --limit 2 --out "$O/search"
