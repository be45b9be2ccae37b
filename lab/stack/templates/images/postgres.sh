#!/bin/sh
# fanout-lab local PostgreSQL image: initdb once (superuser from the environment, its password
# from the file POSTGRES_PASSWORD_FILE names, like the official image), then the server with the
# flags given as arguments (`postgres -c ...`).
set -eu
[ "${1:-}" = postgres ] && shift
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    mkdir -p "$PGDATA" && chown postgres "$PGDATA" && chmod 700 "$PGDATA"
    pwfile=$(mktemp) && cat "${POSTGRES_PASSWORD_FILE:?}" > "$pwfile" && chown postgres "$pwfile"
    runuser -u postgres -- initdb -D "$PGDATA" -U "${POSTGRES_USER:-postgres}" --pwfile="$pwfile" \
        --auth=scram-sha-256 --encoding=UTF8 --locale=C --no-instructions >/dev/null
    rm -f "$pwfile"
    printf '%s\n' 'local all all scram-sha-256' 'host all all all scram-sha-256' \
        'host replication all all scram-sha-256' > "$PGDATA/pg_hba.conf"
fi
exec runuser -u postgres -- postgres -D "$PGDATA" -c listen_addresses='*' "$@"
