#!/bin/bash
# fanout-lab local Kafka image. Like the apache/kafka image: every KAFKA_<NAME> variable is the
# broker property <name> (lower case, _ -> .), except the JVM option variables; storage is
# formatted once with CLUSTER_ID; then the broker runs in the foreground.
set -euo pipefail
conf=/opt/kafka/config/server.properties
: > "$conf"
while IFS='=' read -r key value; do
    case "$key" in
        KAFKA_HEAP_OPTS|KAFKA_JVM_PERFORMANCE_OPTS|KAFKA_OPTS|KAFKA_LOG4J_OPTS) ;;
        KAFKA_*) name=${key#KAFKA_}; name=${name,,}; echo "${name//_/.}=$value" >> "$conf" ;;
    esac
done < <(env)
jvm=(java ${KAFKA_HEAP_OPTS:--Xmx1G -Xms1G} ${KAFKA_JVM_PERFORMANCE_OPTS:-} ${JAVA_EXTRA_OPTS:-}
     -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties -Dkafka.logs.dir=/var/lib/kafka
     -cp '/opt/kafka/libs/*')
logdir=$(sed -n 's/^log\.dirs=//p' "$conf")
if [ ! -e "${logdir:-/var/lib/kafka/data}/meta.properties" ]; then
    "${jvm[@]}" kafka.tools.StorageTool format -t "${CLUSTER_ID:-fanoutlabAAAAAAAAAAAAA}" -c "$conf" >/dev/null
fi
exec "${jvm[@]}" kafka.Kafka "$conf"
