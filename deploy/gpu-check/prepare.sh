#!/usr/bin/env bash
# Fills the ignored .gpu/ folder that the device machine's one call needs (issue 32; docs/gpu-checks.md):
# wheels of the Python packages the GPU machine lacks, pinned to this .venv's versions, Baton's own wheel
# built from the working tree, NIXL for CUDA 13 cut to its UCX backend.
# Run from the repository root after the last code change (about 2 minutes); then, on the device:
#   run(command="bash deploy/gpu-check/all.sh", carry=[".gpu"], timeout_s=560)
set -euo pipefail
R=$(git rev-parse --show-toplevel)
cd "$R"
PY=$R/.venv/bin/python
NIXL=nixl-cu13==1.5.1
grep -qxF '/.gpu/' "$(git rev-parse --git-common-dir)/info/exclude" 2>/dev/null \
  || echo '/.gpu/' >> "$(git rev-parse --git-common-dir)/info/exclude"
rm -rf .gpu && mkdir -p .gpu/whl
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# the device machine has torch, triton, transformers' needs and pytest; these it lacks or has too old
wanted='pydantic|pydantic.core|pydantic.settings|typing.inspection|annotated.types|annotated.doc|'
wanted+='python.dotenv|fastapi|starlette|uvicorn|httpx|httpcore|httpx2|httpcore2|truststore|idna|h11|'
wanted+='anyio|sniffio|openai|distro|jiter|'
wanted+='grpcio|grpcio.health.checking|opentelemetry.api|opentelemetry.sdk|'
wanted+='opentelemetry.semantic.conventions|psutil|pytest.timeout|pytest.asyncio|transformers|tokenizers|'
wanted+='safetensors|huggingface.hub|protobuf|typing.extensions|click|llguidance|jsonschema|'
wanted+='jsonschema.specifications|referencing|rpds.py|attrs|pyyaml|peft|redis|sqlalchemy|alembic|'
wanted+='mako|aiosqlite|greenlet'  # no asyncpg: the GPU checks keep state in SQLite
pins=$("$PY" -m pip freeze 2>/dev/null | grep -iE "^($wanted)==" || true)
platform=(--python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
          --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64
          --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64 --platform any)
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps --only-binary=:all: "${platform[@]}" -d .gpu/whl $pins
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w .gpu/whl .

"$PY" -m pip download -q --no-deps --only-binary=:all: "${platform[@]}" -d "$tmp" "$NIXL"
(cd "$tmp" && unzip -q nixl_cu13-*.whl && rm nixl_cu13-*.whl \
  && rm -rf ./*.dist-info ./*.data nixl_cu13.scripts \
  && "$PY" "$R/deploy/gpu-check/prune_nixl.py" . nixl_cu13 > /dev/null \
  && XZ_OPT=-9 tar cJf "$R/.gpu/nixl.txz" .nixl_cu13.mesonpy.libs nixl_cu13 nixl_cu13.libs)
du -sh .gpu
size=$(du -sm .gpu | cut -f1)
[ "$size" -lt 60 ] || { echo "prepare.sh: .gpu is ${size} MiB, over the 64 MiB carry with the tree" >&2; exit 1; }
