# syntax=docker/dockerfile:1.7
# The trainer: `neorl-industrial train` / `sweep` (one process or a distributed job, e.g.
# deploy/k8s/sweep/job.yaml), `evaluate`, `export` and `datasets import`, tracking to an
# MLflow server. It installs the core with the 'track' extra (MLflow and the plots it logs)
# and the 'plant' extra (plant logs and Minari datasets); no policy server.
#
#   docker build -f docker/trainer.Dockerfile -t neorl-industrial-train:0.1.0 .
#   docker run -v ./runs:/data/runs -v ./run.yaml:/etc/neorl/run.yaml:ro \
#     -e MLFLOW_TRACKING_URI=http://mlflow:5000 neorl-industrial-train:0.1.0 \
#     train -c /etc/neorl/run.yaml

ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

# ----- build: a virtual environment with pinned versions ---------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY docker/constraints.txt ./constraints.txt
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --constraint constraints.txt ".[track,plant]"

# ----- runtime: the environment only, as a non-root user ---------------------------------
FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    JAX_PLATFORMS=cpu \
    NEORL_INDUSTRIAL_JAX_CACHE=/var/lib/neorl/jax-cache
RUN groupadd --system --gid 10001 neorl \
 && useradd --system --uid 10001 --gid neorl --home-dir /var/lib/neorl --create-home neorl
COPY --from=build /opt/venv /opt/venv
USER 10001:10001
WORKDIR /var/lib/neorl
# A batch job, not a service: it exits when the run ends (no port, no health check).
HEALTHCHECK NONE
ENTRYPOINT ["neorl-industrial"]
CMD ["--help"]
