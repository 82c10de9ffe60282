#!/usr/bin/env bash
# A team's MLflow tracking server: runs, metrics and the model registry in PostgreSQL,
# artifacts (plots, checkpoints, policies) in a directory the server serves itself.
#
#   deploy/mlflow/mlflow-server.sh                  # defaults below
#   MLFLOW_DB=mlflow PORT=5000 ARTIFACTS=/srv/mlflow-artifacts deploy/mlflow/mlflow-server.sh
#
# Clients then set MLFLOW_TRACKING_URI=http://<host>:<port> (or tracking.uri in a run's
# configuration). The database is created when it does not exist; MLflow creates and
# migrates its tables on start.
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

# Create the database if it is missing (psycopg is one of the package's dependencies).
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

mkdir -p "$ARTIFACTS"
exec "$PYTHON" -m mlflow server \
  --backend-store-uri "postgresql+psycopg://${PGUSER}${PGPASSWORD:+:${PGPASSWORD}}@${PGHOST}:${PGPORT}/${MLFLOW_DB}" \
  --artifacts-destination "$ARTIFACTS" \
  --serve-artifacts \
  --host "$HOST" \
  --port "$PORT" \
  --workers "$WORKERS"
