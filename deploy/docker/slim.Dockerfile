# Gateway, router and operator: one slim CPU image each, chosen with --build-arg COMPONENT=gateway|router|operator.
# Build from the repository root: docker build -f deploy/docker/slim.Dockerfile --build-arg COMPONENT=operator .
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY services services
COPY operators operators
COPY kernels kernels
COPY loadtest loadtest
# The CPU torch wheel keeps the control-plane images small; they never run a model.
RUN pip install --no-cache-dir --prefix=/install --index-url https://download.pytorch.org/whl/cpu torch \
 && pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim-bookworm
ARG COMPONENT=operator
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 BATON_COMPONENT=${COMPONENT}
COPY --from=build /install /usr/local
RUN groupadd --system --gid 10001 baton && useradd --system --uid 10001 --gid baton --no-create-home baton
USER 10001:10001
# The chart and the operator pass the subcommand (operator, gateway, router) as the first argument.
ENTRYPOINT ["baton"]
CMD ["--help"]
