#!/usr/bin/env bash
# Installs the Debian packages the lab needs and the machine lacks (idempotent; a no-op when all
# are present). Maven fetches Kafka and Debezium from Maven Central; RabbitMQ is Debian's package,
# run by the lab as a private node: 4.0 from a Debian 13 root the lab builds with debootstrap (the
# default), 3.10 from the host's package (LAB_RABBITMQ_VERSION=3.10, and its epmd: installed only
# then; the distribution's own rabbitmq-server service is stopped, disabled and masked, so no broker
# listens on every interface and idles on the measured cores); python3-venv
# for .venv; docker-compose (v1 client) only to validate docker-compose.yml when no `docker compose`
# plugin exists; docker.io for the compose backend (its images are built locally from debootstrap
# roots: no registry needed); chromium, headless, for the report's screenshot and its page test.
# SYSDEPS_ROOT (default: empty, i.e. /) is the directory the script's own paths are looked up under
# (the packaged broker, the init system, policy-rc.d): tests/unit/test_system_deps.py runs the
# script's decisions against a directory of its own, with apt-get and systemctl recorded instead.
set -euo pipefail
root=${SYSDEPS_ROOT:-}
broker=$root/usr/lib/rabbitmq/bin/rabbitmq-server
need=()
command -v mvn >/dev/null 2>&1 || need+=(maven)
if [ "${LAB_RABBITMQ_VERSION:-4.0}" = "3.10" ]; then
  [ -x "$broker" ] || need+=(rabbitmq-server)
fi
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
{ docker compose version || command -v docker-compose; } >/dev/null 2>&1 || need+=(docker-compose)
# a Docker engine for the compose backend's tests; debootstrap for RabbitMQ 4's root and the local images
{ command -v dockerd || command -v docker; } >/dev/null 2>&1 || need+=(docker.io)
{ command -v debootstrap || [ -x "$root/usr/sbin/debootstrap" ]; } >/dev/null 2>&1 || need+=(debootstrap)
# a real browser for the report: its first screen's screenshot and the page's test (headless)
command -v chromium >/dev/null 2>&1 || need+=(chromium)

quiet_host_broker() {
  # the lab runs its own private node; the distribution's service must not run or start at boot
  [ -x "$broker" ] || return 0
  if command -v systemctl >/dev/null 2>&1 && [ -d "$root/run/systemd/system" ]; then
    systemctl stop rabbitmq-server.service epmd.socket epmd.service >/dev/null 2>&1 || true
    systemctl disable rabbitmq-server.service >/dev/null 2>&1 || true
    systemctl mask rabbitmq-server.service >/dev/null 2>&1 || true
  elif [ -x "$root/etc/init.d/rabbitmq-server" ]; then
    # only a running service is stopped: the init script's stop asks rabbitmqctl, whose Erlang
    # leaves an epmd daemon on every interface (port 4369) behind when nothing ran
    if [ -s "$root/run/rabbitmq/pid" ] || [ -s "$root/var/run/rabbitmq/pid" ]; then
      "$root/etc/init.d/rabbitmq-server" stop >/dev/null 2>&1 || true
    fi
    if command -v update-rc.d >/dev/null 2>&1; then
      update-rc.d rabbitmq-server disable >/dev/null 2>&1 || true
    fi
  fi
}

if [ ${#need[@]} -eq 0 ]; then
  [ "$(id -u)" -eq 0 ] && quiet_host_broker
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${need[*]}; install them: sudo apt-get install ${need[*]}" >&2
  exit 1
fi
echo "installing Debian packages: ${need[*]}" >&2
apt-get update -qq
# policy-rc.d 101: no maintainer script starts a daemon while installing (rabbitmq-server, epmd)
policy=$root/usr/sbin/policy-rc.d
own_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && own_policy=1
fi
trap '[ "$own_policy" -eq 1 ] && rm -f "$policy"' EXIT
# what apt and its hooks say (debconf, needrestart) is shown only when the install fails
log=$(mktemp)
if ! DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1 apt-get install -y -qq "${need[@]}" >"$log" 2>&1; then
  cat "$log" >&2
  rm -f "$log"
  exit 1
fi
rm -f "$log"
quiet_host_broker
