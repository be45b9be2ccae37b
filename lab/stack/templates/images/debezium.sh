#!/bin/sh
# fanout-lab local Debezium Server image: the same java command as the native stack
# (JAVA_OPTS from the environment), config/application.properties copied in by the lab.
set -eu
cd /debezium
exec java ${JAVA_OPTS:-} -cp "$(ls /debezium/debezium-server-*runner.jar):config/lib:lib/*" io.debezium.server.Main
