#!/usr/bin/env bash
# RabbitMQ 4.0 (Debian 13 root, the default) against 3.10 (the host's Debian 12 package) in one
# sitting (issue 12 §3, docs/benchmarks.md "RabbitMQ 4.0 ... against 3.10"): per round and release,
# the stack is restarted on that release, then the rabbitmq pipeline runs closed loop at N = 1 and 4
# and at a fixed rate (latency) at N = 1. The release order alternates from round to round.
# Usage: scripts/bench-rabbitmq-releases.sh OUT_DIR   (ROUNDS=3 MESSAGES=10000 RATE=500,
#   CELLS="NAME:N:RATE ..." to run other cells, e.g. CELLS="rate200:1:200")
# Leaves the stack up on the default release.
set -uo pipefail
out=${1:?usage: scripts/bench-rabbitmq-releases.sh OUT_DIR}
mkdir -p "$out"
BIN=${BIN:-.venv/bin}
ROUNDS=${ROUNDS:-3}; MESSAGES=${MESSAGES:-10000}; RATE=${RATE:-500}
for rep in $(seq "$ROUNDS"); do
  if [ $((rep % 2)) = 1 ]; then order="4.0 3.10"; else order="3.10 4.0"; fi
  for v in $order; do
    "$BIN/lab" stack down > /dev/null && LAB_RABBITMQ_VERSION=$v "$BIN/lab" stack up > "$out/up-$v-r$rep.log" 2>&1 \
      || { echo "stack up on $v failed, see $out/up-$v-r$rep.log" >&2; exit 1; }
    for cell in ${CELLS:-c1:1:0 c4:4:0 rate:1:$RATE}; do
      name=${cell%%:*}; rest=${cell#*:}; n=${rest%%:*}; rate=${rest#*:}
      f="$out/$v-$name-r$rep.json"
      LAB_RABBITMQ_VERSION=$v "$BIN/lab" bench run --pipeline rabbitmq --consumers "$n" --messages "$MESSAGES" \
        --rate "$rate" --cooldown-s 5 --repeats 1 > "$f" 2> "$f.err"
      echo "$(date -u +%T) rabbitmq $v $name round $rep rc=$? load $(cut -d' ' -f1 /proc/loadavg)" | tee -a "$out/progress" >&2
    done
  done
done
"$BIN/lab" stack down > /dev/null && "$BIN/lab" stack up > /dev/null
