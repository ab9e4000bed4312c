# Source this file: starts a private PostgreSQL cluster for the multi-worker tests and exports
# PG_URL; `pg_stop` stops it. Uses Debian's postgresql package (installed by .ci/run).
# PostgreSQL refuses to run as root, so the cluster runs as the `postgres` user.
# It listens on no TCP port at all, only on a Unix socket in its own temporary directory, so
# nothing else on the machine can hold its port or be reached by mistake.
PG_BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
PG_DIR=$(mktemp -d /tmp/autotune-pg.XXXXXX)
chown postgres "$PG_DIR"
runuser -u postgres -- "$PG_BIN/initdb" -D "$PG_DIR/data" -U postgres -A trust >/dev/null
runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/log" -w \
  -o "-c listen_addresses='' -c unix_socket_directories=$PG_DIR -c max_connections=200" start >/dev/null
runuser -u postgres -- "$PG_BIN/createdb" -h "$PG_DIR" -U postgres autotune_test
export PG_URL="postgresql+psycopg2://postgres@/autotune_test?host=$PG_DIR"
pg_stop() { runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m fast stop >/dev/null 2>&1 || true; rm -rf "$PG_DIR"; }
