#!/usr/bin/env bash
# Runs "$@" (the test suite) with a Docker engine for the compose backend's integration tests:
# starts dockerd when none answers and we may (root, dockerd installed), builds the local images
# once (`lab stack images build`, cached in ~/.cache/fanout-lab/images, outside the checkout),
# and stops dockerd afterwards if this script started it. Without an engine the compose tests
# skip themselves with the reason; everything else runs.
set -uo pipefail
BIN=${BIN:-.venv/bin}
started=""
engine() { "$BIN/python" -c 'import docker; docker.from_env(timeout=5).ping()' >/dev/null 2>&1; }
stop_engine() {
  if [ -n "$started" ]; then
    kill "$started" 2>/dev/null && wait "$started" 2>/dev/null
    echo "with-docker: stopped the dockerd it started (pid $started)" >&2
  fi
}
trap stop_engine EXIT
if ! engine; then
  if [ "$(id -u)" = 0 ] && command -v dockerd >/dev/null 2>&1; then
    log="${TMPDIR:-/tmp}/fanout-lab-dockerd.log"
    dockerd >"$log" 2>&1 &
    started=$!
    for _ in $(seq 60); do engine && break; sleep 1; done
    engine && echo "with-docker: started dockerd (pid $started, log $log)" >&2 \
      || echo "with-docker: dockerd did not answer within 60 s (see $log)" >&2
  else
    echo "with-docker: no Docker engine; the compose backend's integration tests will be skipped" >&2
  fi
fi
if engine; then
  t0=$(date +%s)
  "$BIN/lab" stack images build >/dev/null \
    && echo "with-docker: local images ready in $(( $(date +%s) - t0 )) s" >&2 \
    || echo "with-docker: local images not built; the compose backend's tests will say why" >&2
fi
"$@"
