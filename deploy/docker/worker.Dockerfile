# The worker: engine, Triton kernels and NIXL KV transfer on a CUDA base.
# Build from the repository root: docker build -f deploy/docker/worker.Dockerfile .
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
FROM ${CUDA_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/baton PATH=/opt/baton/bin:$PATH HF_HOME=/cache
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.12 python3.12-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3.12 -m venv /opt/baton
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY services services
COPY operators operators
COPY kernels kernels
COPY loadtest loadtest
RUN pip install --no-cache-dir torch triton nixl-cu12 && pip install --no-cache-dir . && rm -rf /src
RUN groupadd --system --gid 10001 baton && useradd --system --uid 10001 --gid baton --no-create-home baton \
 && mkdir -p /cache /models && chown 10001:10001 /cache
WORKDIR /
USER 10001:10001
# The operator's defaults: gRPC, the NIXL metadata listener (gRPC + 1), and /metrics, /health, /ready.
EXPOSE 8100 8101 9100
ENTRYPOINT ["baton"]
CMD ["worker", "--help"]
