#!/usr/bin/env bash
# Installs the Debian packages the lab needs and the machine lacks (idempotent; a no-op when all
# are present). Maven fetches Kafka and Debezium from Maven Central; RabbitMQ is Debian's package,
# run by the lab as a private node; python3-venv for .venv; docker-compose (v1 client) only to
# validate docker-compose.yml when no `docker compose` plugin exists; docker.io and debootstrap for
# the compose backend (its images are built locally: no registry needed).
set -euo pipefail
need=()
command -v mvn >/dev/null 2>&1 || need+=(maven)
[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || need+=(rabbitmq-server)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
{ docker compose version || command -v docker-compose; } >/dev/null 2>&1 || need+=(docker-compose)
# the compose backend's integration tests: a Docker engine, and debootstrap for the local images
{ command -v dockerd || command -v docker; } >/dev/null 2>&1 || need+=(docker.io)
{ command -v debootstrap || [ -x /usr/sbin/debootstrap ]; } >/dev/null 2>&1 || need+=(debootstrap)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${need[*]}; install them: sudo apt-get install ${need[*]}" >&2
  exit 1
fi
echo "installing Debian packages: ${need[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
