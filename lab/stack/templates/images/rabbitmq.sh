#!/bin/sh
# fanout-lab local RabbitMQ image: no plugins (as the native node), console log, then the node in
# the foreground. The lab user comes from the definitions the lab copies into conf.d (a password
# hash; loaded from /etc/rabbitmq/conf.d/*.conf after this file), as on the official image.
set -eu
cat > /etc/rabbitmq/rabbitmq.conf <<CONF
listeners.tcp.default = 5672
loopback_users = none
disk_free_limit.absolute = 50MB
log.console = true
log.file = false
CONF
chmod 644 /etc/rabbitmq/rabbitmq.conf
printf '[].\n' > /etc/rabbitmq/enabled_plugins
exec rabbitmq-server
