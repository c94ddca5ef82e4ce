#!/bin/bash
# Several routes on one box, back to back, across device calls without losing it between them: the first call copies
# the tree to /tmp/amprepro-chain/tree and starts the stages there in their own process session (setsid: it runs on
# between calls, and a call's end or a re-copied tree does not touch it); every call then waits for it up to its
# budget and brings back what has finished. Call again at once (a box goes back about 30 s after a call).
#
#   COMMIT=<hash> bash tools/gpu/chain.sh start [seconds]   # first call: carry .whl-a .whl vendor/apex-25.05*
#                                                           # vendor/timm (tools/gpu/README.md, "One call on a fresh box")
#   bash tools/gpu/chain.sh wait [seconds]                  # every later call, carrying nothing
#   STAGES="full12" COMMIT=<hash> bash tools/gpu/chain.sh start   # some of the stages only, in this order
#   STAGES="ttv ref" COMMIT=<hash> bash tools/gpu/chain.sh start  # two reference runs of the paper preset on one box
#
# The stages: ttv, issue 40's fresh-box paper route with apex built cold, to make verify's verdict, then timm
# (time_to_verdict.sh); full, the full preset (issue 39) in the same results/, so it runs only the cells the paper
# preset has not, then make verify; full12, the full preset at a 12 GiB cap, then make verify; ref, the paper preset's
# route again in a copy of the tree with no results/ (another reference run of this machine, to promote: one box then
# gives two runs); ab, after ttv in its results/, the 7B mixed-precision cells with the train loop of ab-old/ (an older
# commit's loop.py and measure.py, put there untracked) and of this tree, side by side (tools/gpu/loop_ab.py).
set -uo pipefail
OUT=${OUT:?set OUT to the output directory of the call}
mkdir -p "$OUT" || exit 1
mode=${1:?start or wait}
budget=${2:-560}
deadline=$((SECONDS + budget))
chain=${AMPREPRO_CHAIN_DIR:-/tmp/amprepro-chain}  # a test points it elsewhere
tree=$chain/tree
if [ "$mode" = start ] && [ ! -f "$chain/started" ]; then
  COMMIT=${COMMIT:?set COMMIT to the commit being measured}
  [[ $COMMIT =~ ^[0-9a-f]{7,40}$ ]] || { echo "COMMIT=$COMMIT is not a commit hash"; exit 1; }
  stages=${STAGES:-ttv full full12}
  for stage in $stages; do
    [[ $stage =~ ^(ttv|full|full12|ref|ab)$ ]] || {
      echo "STAGES: $stage is not one of ttv, full, full12, ref, ab"
      exit 1
    }
  done
  if [[ " $stages " == *" ab "* ]] && [ ! -f ab-old/loop.py ]; then
    echo "STAGES: ab needs ab-old/loop.py and ab-old/measure.py (an older commit's, carried)"
    exit 1
  fi
  mkdir -p "$tree" "$chain/out"
  tar cf - --exclude=./results --exclude=./.snakemake . | tar xf - -C "$tree" || exit 1
  date +%s > "$chain/started"
  {
    echo "cd $tree"
    for stage in $stages; do
      echo "echo \"stage $stage \$(date +%s)\""
      case $stage in
        ttv) echo "OUT=$chain/out/ttv COMMIT=$COMMIT bash tools/gpu/time_to_verdict.sh 1150 > $chain/ttv.out 2>&1" ;;
        full) echo "RUN_PRESET=full RUN_CAP=none OUT=$chain/out/full bash tools/gpu/full_run.sh 1700 verify" \
                   "> $chain/full.out 2>&1" ;;
        full12) echo "RUN_PRESET=full RUN_CAP=12 OUT=$chain/out/full12 bash tools/gpu/full_run.sh 1700 verify" \
                     "> $chain/full12.out 2>&1" ;;
        ref) echo "mkdir -p $chain/ref-tree && tar cf - --exclude=./results --exclude=./.snakemake . |" \
                  "tar xf - -C $chain/ref-tree && (cd $chain/ref-tree &&" \
                  "OUT=$chain/out/ref bash tools/gpu/make_run.sh 1150 verify > $chain/ref.out 2>&1)" ;;
        ab) echo "mkdir -p $chain/out/ab && CUDA_VISIBLE_DEVICES=0 ${AMPREPRO_VENV:-/tmp/amprepro-venv}/bin/python" \
                 "tools/gpu/loop_ab.py --old ab-old --apex results/apex/apex.json --out $chain/out/ab" \
                 "--model llama7b > $chain/ab.out 2>&1" ;;
      esac
    done
    echo "echo \"stage done \$(date +%s)\""
  } > "$chain/stages.sh"
  setsid nohup bash "$chain/stages.sh" > "$chain/stages.log" 2>&1 < /dev/null &
  echo "chain started at $(cat "$chain/started") in $tree"
fi
[ -f "$chain/started" ] || { echo "no chain on this box: the box is fresh, start it again"; exit 1; }
while [ $((deadline - SECONDS)) -gt 25 ] && ! grep -q "stage done" "$chain/stages.log" 2>/dev/null; do
  sleep 5
done
echo "== $(($(date +%s) - $(cat "$chain/started"))) s since the chain started"
cat "$chain/stages.log"
for f in ttv full full12 ref ab; do [ -f "$chain/$f.out" ] && { echo "== $f"; tail -n 30 "$chain/$f.out"; }; done
# At most 8 files come back: one tarball per finished stage folder, plus the running stage's make-run log.
for d in ttv full full12 ref ab; do
  [ -d "$chain/out/$d" ] && tar czf "$OUT/$d.tgz" -C "$chain/out" "$d"
done
for log in /tmp/amprepro-ttv-make-run*.log /tmp/make-run-full-none.log /tmp/make-run-full-12.log; do
  [ -f "$log" ] && gzip -c "$log" > "$OUT/$(basename "$log").gz"
done
cp "$chain/stages.log" "$OUT/" 2>/dev/null
ls -la "$OUT"
