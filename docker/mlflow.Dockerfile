# syntax=docker/dockerfile:1.7
# The MLflow tracking server of a team: PostgreSQL backend store, served artifacts.
#
#   docker build -f docker/mlflow.Dockerfile -t neorl-mlflow:3.17.2 .
#   docker run -p 5000:5000 \
#     -e MLFLOW_BACKEND_STORE_URI=postgresql+psycopg://mlflow:secret@postgres:5432/mlflow \
#     -v mlflow-artifacts:/var/lib/mlflow/artifacts neorl-mlflow:3.17.2

ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY docker/constraints.txt /tmp/constraints.txt
RUN pip install --constraint /tmp/constraints.txt mlflow "psycopg[binary]"

FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 \
    MLFLOW_ARTIFACTS_DESTINATION=/var/lib/mlflow/artifacts
RUN groupadd --system --gid 10001 mlflow \
 && useradd --system --uid 10001 --gid mlflow --home-dir /var/lib/mlflow --create-home mlflow \
 && mkdir -p /var/lib/mlflow/artifacts && chown -R mlflow:mlflow /var/lib/mlflow
COPY --from=build /opt/venv /opt/venv
USER 10001:10001
WORKDIR /var/lib/mlflow
EXPOSE 5000
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:5000/health', timeout=2)"]
# MLFLOW_BACKEND_STORE_URI is required (postgresql+psycopg://user:password@host:5432/db).
ENTRYPOINT ["sh", "-c", "exec mlflow server --backend-store-uri \"$MLFLOW_BACKEND_STORE_URI\" --artifacts-destination \"$MLFLOW_ARTIFACTS_DESTINATION\" --serve-artifacts --host 0.0.0.0 --port 5000 --workers 2 --allowed-hosts \"${MLFLOW_ALLOWED_HOSTS:-*}\""]
