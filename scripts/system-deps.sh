#!/usr/bin/env bash
# Installs the Debian packages the lab needs and the machine lacks (idempotent; a no-op when all
# are present). Maven fetches Kafka and Debezium from Maven Central; RabbitMQ is Debian's package,
# run by the lab as a private node: 4.0 from a Debian 13 root the lab builds with debootstrap (the
# default), 3.10 from the host's package (LAB_RABBITMQ_VERSION=3.10, and its epmd); python3-venv
# for .venv; docker-compose (v1 client) only to validate docker-compose.yml when no `docker compose`
# plugin exists; docker.io for the compose backend (its images are built locally from debootstrap
# roots: no registry needed).
set -euo pipefail
need=()
command -v mvn >/dev/null 2>&1 || need+=(maven)
[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || need+=(rabbitmq-server)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
{ docker compose version || command -v docker-compose; } >/dev/null 2>&1 || need+=(docker-compose)
# a Docker engine for the compose backend's tests; debootstrap for RabbitMQ 4's root and the local images
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
