#!/bin/sh
# fanout-lab local RabbitMQ image: the user from RABBITMQ_DEFAULT_USER/PASS (like the official
# image), no plugins (as the native node), console log, then the node in the foreground.
set -eu
cat > /etc/rabbitmq/rabbitmq.conf <<CONF
listeners.tcp.default = 5672
loopback_users = none
default_user = ${RABBITMQ_DEFAULT_USER:?}
default_pass = ${RABBITMQ_DEFAULT_PASS:?}
disk_free_limit.absolute = 50MB
log.console = true
log.file = false
CONF
chmod 644 /etc/rabbitmq/rabbitmq.conf
printf '[].\n' > /etc/rabbitmq/enabled_plugins
exec rabbitmq-server
