# fanout-lab local image: RabbitMQ ${rabbitmq_version} from Debian ${suite} (installed in the base root filesystem)
FROM ${base}
COPY entrypoint.sh /usr/local/bin/lab-entrypoint
EXPOSE 5672
ENTRYPOINT ["/bin/sh", "/usr/local/bin/lab-entrypoint"]
