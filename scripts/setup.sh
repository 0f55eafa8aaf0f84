#!/usr/bin/env bash
# One-command set-up: a virtualenv in .venv, the project (editable) with its CPU extras, and the
# offline models. Idempotent: a second run with an unchanged pyproject.toml skips pip entirely.
#
#   bash scripts/setup.sh            # CPU machine: torch==2.13.0 (the CPU wheel)
#   DRMAS_TORCH="torch==2.6.0" bash scripts/setup.sh   # a GPU user picks their own torch build
#   DRMAS_TORCH="torch==2.14.1" DRMAS_EXTRAS="dense,ray,mathverify,lucene,test,sglang" bash scripts/setup.sh
#                                    # SGLang (GPU): needs torch 2.14.1, Python >= 3.11, driver >= 580
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${DRMAS_VENV:-.venv}
TORCH_SPEC=${DRMAS_TORCH:-torch==2.13.0}
EXTRAS=${DRMAS_EXTRAS:-dense,ray,mathverify,lucene,inspect,test}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"

stamp="$VENV/.drmas-setup-stamp"
want="$(cat pyproject.toml | sha256sum | cut -d' ' -f1) $TORCH_SPEC $EXTRAS"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && python -c "import drmas_bench" 2>/dev/null; then
  echo "[setup] packages up to date ($VENV)"
else
  echo "[setup] installing drmas-bench[$EXTRAS] with $TORCH_SPEC"
  python -m pip install -q --upgrade pip
  # torch is named in the same command so nothing can pull an unpinned (CUDA) build. pip would
  # byte-compile the packages on one core (70 of its 115 s here); compileall does it on every core
  # (33 s on 2), and only files that do not compile (some packages ship test fixtures that are not
  # Python 3) are left without a .pyc, as pip leaves them
  python -m pip install -q --no-compile "$TORCH_SPEC" -e ".[$EXTRAS]"
  python -m compileall -qq -j 0 "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || true
  echo "$want" > "$stamp"
fi
# the project's own modules too (an editable install: compileall above skips them), every run, since
# the code changes without pyproject.toml: where PYTHONDONTWRITEBYTECODE is set (CI's image), no import
# writes a .pyc, and every process would compile the project's ~230 modules from source again
python -m compileall -qq -j 0 drmas_bench trainer retrieval || true

echo "[setup] preparing offline models in ${DRMAS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/drmas-bench} (DRMAS_CACHE_DIR moves it)"
# two processes, each model's preparation its own: the SmolLM2 pair (the search model merges its
# adapter into the instruct one) beside the tiny random pair
# DRMAS_SETUP_TINY_READY=FILE: the file is created once the tiny pair is ready (.ci/run starts its CPU
# training recipes then, on the core the SmolLM2 preparation leaves idle)
( drmas-bench models prepare tiny-random tiny-random-llama && if [ -n "${DRMAS_SETUP_TINY_READY:-}" ]; then
    : > "$DRMAS_SETUP_TINY_READY"; fi ) &
tiny_pid=$!
drmas-bench models prepare smollm2-135m-instruct smollm2-135m-search
wait "$tiny_pid"

echo "[setup] done. Activate with: . $VENV/bin/activate"
