#!/usr/bin/env bash
# Python 3.10 against 3.11 on the pipeline's training step, on this CPU (tools/python_speed/bench.py says what is
# timed). Each round runs every cell under both interpreters, one fresh process each, the interpreters' order
# alternating round by round (3.10 first, then 3.11 first) so a drift in the machine's load falls on both alike.
#
#   tools/python_speed/run.sh PY310 PY311 OUT.jsonl [ROUNDS]
#
# PY310, PY311: python executables with the same torch build installed (tools/python_speed/README.md: how the
# evidence's were made). OUT.jsonl gets one line per run; summarize.py turns it into the evidence JSON.
# CELLS (environment): the cells to run, of bench.py's; default all three.
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: $0 PY310 PY311 OUT.jsonl [ROUNDS]  (two python executables, the output file, rounds: default 7)" >&2
    exit 2
fi
py310=$1 py311=$2 out=$3 rounds=${4:-7}
case $rounds in ''|*[!0-9]*) echo "ROUNDS must be a whole number, got '$rounds'" >&2; exit 2 ;; esac
for py in "$py310" "$py311"; do
    [ -x "$py" ] || { echo "$py is not an executable python: give the interpreters' paths" >&2; exit 2; }
done
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export PYTHONPATH=$repo/workflow OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
: > "$out"
for round in $(seq 1 "$rounds"); do
    if [ $((round % 2)) -eq 1 ]; then order="py310 py311"; else order="py311 py310"; fi
    for cell in ${CELLS:-launch_tiny_transformer compute_gpt_bytes control_pure_python}; do
        case $cell in
            launch_tiny_transformer) steps=300 warmup=30 ;;
            compute_gpt_bytes) steps=15 warmup=3 ;;
            control_pure_python) steps=200 warmup=20 ;;
            *) echo "unknown cell '$cell' in CELLS: bench.py --help lists them" >&2; exit 2 ;;
        esac
        for label in $order; do
            if [ $label = py310 ]; then py=$py310; else py=$py311; fi
            "$py" "$here/bench.py" --cell $cell --steps $steps --warmup $warmup --label $label \
                | sed "s/^{/{\"round\": $round, /" >> "$out"
        done
    done
    echo "round $round of $rounds done" >&2
done
