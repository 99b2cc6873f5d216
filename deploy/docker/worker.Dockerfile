# The worker: engine, Triton kernels and NIXL KV transfer on a CUDA base, one image per CUDA major (the NIXL
# wheel, its bundled UCX CUDA modules and torch must match the driver's CUDA major).
# Build from the repository root:
#   CUDA 12: docker build -f deploy/docker/worker.Dockerfile -t baton-worker:0.1.0-cu12 .
#   CUDA 13: docker build -f deploy/docker/worker.Dockerfile --build-arg CUDA_MAJOR=13 \
#              --build-arg CUDA_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu24.04 \
#              --build-arg TORCH_INDEX_URL=<the PyTorch cu130 wheel index> -t baton-worker:0.1.0-cu13 .
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
FROM ${CUDA_IMAGE}
ARG CUDA_MAJOR=12
# Empty: PyPI's torch (built for CUDA 12); set it to a CUDA-13 wheel index for CUDA_MAJOR=13.
ARG TORCH_INDEX_URL=""
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
RUN pip install --no-cache-dir ${TORCH_INDEX_URL:+--index-url ${TORCH_INDEX_URL}} torch triton \
 && pip install --no-cache-dir ".[cu${CUDA_MAJOR}]" && rm -rf /src
RUN groupadd --system --gid 10001 baton && useradd --system --uid 10001 --gid baton --no-create-home baton \
 && mkdir -p /cache /models && chown 10001:10001 /cache
WORKDIR /
USER 10001:10001
# The operator's defaults: gRPC, the NIXL metadata listener (gRPC + 1), and /metrics, /health, /ready.
EXPOSE 8100 8101 9100
ENTRYPOINT ["baton"]
CMD ["worker", "--help"]
