#!/usr/bin/env bash
# Consumer layouts in one sitting (issue 12 §2, docs/benchmarks.md "Consumer layout"): every
# pipeline at every N with `processes` and `tasks` alternating (lab bench options), ROUNDS rounds;
# N = 1 gets one round (both layouts are then one consumer in one process: a null check).
# The stack must be up (`lab stack up`). Usage: scripts/bench-layouts.sh OUT_DIR
#   (ROUNDS=3 MESSAGES=5000 CONSUMERS="1 4 8 16" PIPELINES="wal wal-sharded kafka rabbitmq")
set -uo pipefail
out=${1:?usage: scripts/bench-layouts.sh OUT_DIR}
mkdir -p "$out"
BIN=${BIN:-.venv/bin}
ROUNDS=${ROUNDS:-3}; MESSAGES=${MESSAGES:-5000}
for n in ${CONSUMERS:-1 4 8 16}; do
  for p in ${PIPELINES:-wal wal-sharded kafka rabbitmq}; do
    rounds=$ROUNDS; [ "$n" = 1 ] && rounds=1
    f="$out/$p-$n.json"
    [ -s "$f" ] && continue  # resumable: a finished cell is kept
    "$BIN/lab" bench options --pipeline "$p" --consumers "$n" --messages "$MESSAGES" --cooldown-s 5 \
      --vary consumer_layout=processes,tasks --repeats "$rounds" > "$f.tmp" 2> "$f.err"
    rc=$?
    [ $rc = 0 ] && mv "$f.tmp" "$f"
    echo "$(date -u +%T) $p c$n rounds $rounds rc=$rc load $(cut -d' ' -f1 /proc/loadavg)" | tee -a "$out/progress" >&2
  done
done
