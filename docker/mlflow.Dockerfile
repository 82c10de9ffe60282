# syntax=docker/dockerfile:1.7
# The MLflow tracking server of a team: PostgreSQL backend store, served artifacts and
# MLflow's basic authentication, started by deploy/mlflow/mlflow-server.sh.
#
#   docker build -f docker/mlflow.Dockerfile -t neorl-mlflow:3.17.2 .
#   docker run -p 5000:5000 -e PGHOST=postgres -e PGUSER=mlflow \
#     -e POSTGRES_PASSWORD_FILE=/run/secrets/postgres-password \
#     -e MLFLOW_ADMIN_PASSWORD_FILE=/run/secrets/mlflow-admin-password \
#     -v ./secrets:/run/secrets:ro -v mlflow-data:/var/lib/mlflow neorl-mlflow:3.17.2
#
# Passwords come from files only: none on a command line, in a URI or with a default.

ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY docker/constraints.txt /tmp/constraints.txt
RUN pip install --constraint /tmp/constraints.txt "mlflow[auth]" "psycopg[binary]"

FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 \
    PYTHON=python HOST=0.0.0.0 PORT=5000 WORKERS=2 \
    ARTIFACTS=/var/lib/mlflow/artifacts AUTH_DB=/var/lib/mlflow/auth/auth.db
RUN groupadd --system --gid 10001 mlflow \
 && useradd --system --uid 10001 --gid mlflow --home-dir /var/lib/mlflow --create-home mlflow \
 && mkdir -p /var/lib/mlflow/artifacts /var/lib/mlflow/auth \
 && chown -R mlflow:mlflow /var/lib/mlflow
COPY --from=build /opt/venv /opt/venv
COPY deploy/mlflow/mlflow-server.sh /opt/neorl/mlflow-server.sh
USER 10001:10001
WORKDIR /var/lib/mlflow
EXPOSE 5000
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:5000/health', timeout=2)"]
# PGHOST, PGUSER, MLFLOW_DB, POSTGRES_PASSWORD_FILE, MLFLOW_ADMIN_PASSWORD_FILE: see
# deploy/mlflow/README.md.
ENTRYPOINT ["bash", "/opt/neorl/mlflow-server.sh"]
