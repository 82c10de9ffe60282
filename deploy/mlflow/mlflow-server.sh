#!/usr/bin/env bash
# A team's MLflow tracking server: runs, metrics and the model registry in PostgreSQL,
# artifacts (plots, checkpoints, policies) in a directory the server serves itself, and
# MLflow's basic authentication in front of it.
#
#   MLFLOW_ADMIN_PASSWORD_FILE=/run/secrets/mlflow-admin-password \
#   POSTGRES_PASSWORD_FILE=/run/secrets/postgres-password deploy/mlflow/mlflow-server.sh
#
# No password is ever on a command line or inside a URI: the database password reaches
# libpq through a pgpass file (PGPASSFILE, or one written here, mode 0600, from
# POSTGRES_PASSWORD_FILE), the admin password through MLflow's auth config file (written
# here, mode 0600). There is no default password. Clients set
# MLFLOW_TRACKING_URI=http://<host>:<port> and MLFLOW_TRACKING_USERNAME/_PASSWORD.
set -euo pipefail

PGHOST="${PGHOST:-127.0.0.1}"
PGPORT="${PGPORT:-5432}"
PGUSER="${PGUSER:-postgres}"
MLFLOW_DB="${MLFLOW_DB:-mlflow}"
HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-5000}"
ARTIFACTS="${ARTIFACTS:-./mlflow-artifacts}"
WORKERS="${WORKERS:-2}"
PYTHON="${PYTHON:-python}"
# Basic authentication: on unless MLFLOW_AUTH=off says a closed network or a test.
MLFLOW_AUTH="${MLFLOW_AUTH:-on}"
MLFLOW_ADMIN_USER="${MLFLOW_ADMIN_USER:-admin}"
AUTH_DB="${AUTH_DB:-./mlflow-auth.db}"

if [[ -n "${PGPASSWORD:-}" ]]; then
  echo "error: PGPASSWORD is set; give the database password as a file instead" \
    "(POSTGRES_PASSWORD_FILE or PGPASSFILE)" >&2
  exit 2
fi

PRIVATE="$(mktemp -d)"  # 0700: the pgpass and auth config written below
trap 'rm -rf "$PRIVATE"' EXIT
umask 077

if [[ -n "${POSTGRES_PASSWORD_FILE:-}" ]]; then
  if [[ ! -r "$POSTGRES_PASSWORD_FILE" ]]; then
    echo "error: POSTGRES_PASSWORD_FILE=$POSTGRES_PASSWORD_FILE cannot be read" >&2
    exit 2
  fi
  # pgpass fields escape ':' and '\'.
  password="$(head -n 1 "$POSTGRES_PASSWORD_FILE" | sed -e 's/\\/\\\\/g' -e 's/:/\\:/g')"
  printf '%s:%s:*:%s:%s\n' "$PGHOST" "$PGPORT" "$PGUSER" "$password" > "$PRIVATE/pgpass"
  unset password
  export PGPASSFILE="$PRIVATE/pgpass"
fi
# Without either, libpq connects without a password (trust or peer authentication).

case "$MLFLOW_AUTH" in
  on)
    if [[ -z "${MLFLOW_ADMIN_PASSWORD_FILE:-}" || ! -r "${MLFLOW_ADMIN_PASSWORD_FILE}" ]]; then
      echo "error: MLFLOW_ADMIN_PASSWORD_FILE must name a readable file with the admin" \
        "password (e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')," \
        "or MLFLOW_AUTH=off to serve without authentication" >&2
      exit 2
    fi
    admin_password="$(head -n 1 "$MLFLOW_ADMIN_PASSWORD_FILE")"
    if [[ ${#admin_password} -lt 16 ]]; then
      echo "error: $MLFLOW_ADMIN_PASSWORD_FILE: the admin password is shorter than 16" >&2
      exit 2
    fi
    AUTH_DB_PATH="$(cd "$(dirname "$AUTH_DB")" && pwd)/$(basename "$AUTH_DB")"
    cat > "$PRIVATE/basic_auth.ini" <<INI
[mlflow]
default_permission = READ
database_uri = sqlite:///${AUTH_DB_PATH}
admin_username = ${MLFLOW_ADMIN_USER}
admin_password = ${admin_password}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
INI
    unset admin_password
    export MLFLOW_AUTH_CONFIG_PATH="$PRIVATE/basic_auth.ini"
    if [[ -n "${MLFLOW_FLASK_SECRET_KEY_FILE:-}" ]]; then
      MLFLOW_FLASK_SERVER_SECRET_KEY="$(head -n 1 "$MLFLOW_FLASK_SECRET_KEY_FILE")"
    else
      # The workers share one key per start (it signs CSRF tokens, not credentials).
      MLFLOW_FLASK_SERVER_SECRET_KEY="$("$PYTHON" -c 'import secrets; print(secrets.token_hex(32))')"
    fi
    export MLFLOW_FLASK_SERVER_SECRET_KEY
    APP=(--app-name basic-auth)
    ;;
  off) APP=() ;;
  *) echo "error: MLFLOW_AUTH=$MLFLOW_AUTH; expected on or off" >&2; exit 2 ;;
esac

# Create the database if it is missing (psycopg is one of the package's dependencies);
# libpq reads the password from PGPASSFILE.
"$PYTHON" - "$PGHOST" "$PGPORT" "$PGUSER" "$MLFLOW_DB" <<'PY'
import sys

import psycopg
from psycopg import sql

host, port, user, name = sys.argv[1:]
with psycopg.connect(host=host, port=int(port), user=user, dbname="postgres", autocommit=True) as c:
    if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        print(f"created database {name}")
PY

ALLOWED=()
if [[ -n "${MLFLOW_ALLOWED_HOSTS:-}" ]]; then
  ALLOWED=(--allowed-hosts "$MLFLOW_ALLOWED_HOSTS")
fi

mkdir -p "$ARTIFACTS"
# Not exec: the trap removes the private directory when the server stops.
"$PYTHON" -m mlflow server \
  --backend-store-uri "postgresql+psycopg://${PGUSER}@${PGHOST}:${PGPORT}/${MLFLOW_DB}" \
  --artifacts-destination "$ARTIFACTS" \
  --serve-artifacts \
  --host "$HOST" \
  --port "$PORT" \
  --workers "$WORKERS" \
  "${APP[@]}" "${ALLOWED[@]}" &
server=$!
trap 'kill -TERM "$server" 2>/dev/null; wait "$server"; rm -rf "$PRIVATE"' TERM INT
wait "$server"
