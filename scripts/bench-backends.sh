#!/usr/bin/env bash
# Native against compose in one sitting (issue 13, docs/benchmarks.md "Native against compose"):
# every cell on both backends back to back, the order alternating from cell to cell, ROUNDS rounds.
# Both stacks must be up: `lab stack up`, and the compose one with the variables below.
# Usage: scripts/bench-backends.sh OUT_DIR   (ROUNDS=3 MESSAGES=20000 by default)
set -uo pipefail
out=${1:?usage: scripts/bench-backends.sh OUT_DIR}
mkdir -p "$out"
BIN=${BIN:-.venv/bin}
ROUNDS=${ROUNDS:-3}; MESSAGES=${MESSAGES:-20000}
compose=(env LAB_BACKEND=compose LAB_COMPOSE_IMAGES=local LAB_COMPOSE_PROJECT=${COMPOSE_PROJECT:-fanout-lab-cmp}
         LAB_STACK_DIR=${COMPOSE_STACK_DIR:-.stack/compose} LAB_PG_PORT=29532 LAB_KAFKA_PORT=33192 LAB_AMQP_PORT=29773)
i=0
for rep in $(seq "$ROUNDS"); do
  for cell in wal:1 wal:4 wal-sharded:1 wal-sharded:4 kafka:1 kafka:4 rabbitmq:1 rabbitmq:4; do
    p=${cell%:*}; n=${cell#*:}; i=$((i + 1))
    if [ $((i % 2)) = 0 ]; then order="native compose"; else order="compose native"; fi
    for b in $order; do
      f="$out/$b-$p-$n-r$rep.json"
      pre=(); [ "$b" = compose ] && pre=("${compose[@]}")
      "${pre[@]}" "$BIN/lab" bench run --pipeline "$p" --consumers "$n" --messages "$MESSAGES" --repeats 1 \
        --cooldown-s 5 > "$f" 2> "$f.err"
      echo "$(date -u +%T) $b $p c$n round $rep rc=$? load $(cut -d' ' -f1 /proc/loadavg)" | tee -a "$out/progress" >&2
    done
  done
done
