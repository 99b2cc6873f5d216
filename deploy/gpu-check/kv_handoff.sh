#!/usr/bin/env bash
# Issue 13's checks on the lent GPU machine: KV hand-off between two processes' CUDA caches, and the disaggregated
# stack on one GPU. Run from the repository root there, with .gpu/ carried (docs/gpu-checks.md says how to fill it):
#   bash deploy/gpu-check/kv_handoff.sh bench tests     # ~6 min
#   bash deploy/gpu-check/kv_handoff.sh exact            # ~6 min: 8B-shaped checkpoint, disaggregated vs colocated
#   bash deploy/gpu-check/kv_handoff.sh loadtest         # ~9 min: baton loadtest, colocated vs disaggregated
# Every result goes to $OUT (the device tool brings it back).
set -uo pipefail
OUT=${OUT:-/tmp/out}
SITE=/tmp/site
MODEL=/tmp/8b
mkdir -p "$OUT"

setup() {
  if [ ! -d "$SITE/baton" ]; then
    python3 -m pip install -q --no-index --no-deps --target "$SITE" .gpu/whl/*.whl
    tar xJf .gpu/nixl.txz -C "$SITE"
  fi
  export PYTHONPATH=$SITE
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.csv"
  python3 -c "import torch; from baton.services.worker.kv_transfer.nixl_loader import bundled_ucx_module_dir, \
load_nixl; print('torch', torch.__version__, 'cuda', torch.version.cuda); print('ucx modules', \
bundled_ucx_module_dir()); print(load_nixl())" 2>&1 | tee "$OUT/setup.txt"
}

baton() { python3 -m baton.services.cli.main "$@"; }

bench() {
  for blocks in random consecutive; do
    for kind in cuda_ipc nixl; do
      timeout 240 baton --log-level WARNING bench kv-transfer --device cuda --layout llama-8b \
        --sizes 1 16 64 256 1024 --repeats 10 --transports "$kind" --blocks "$blocks" \
        --output-json "$OUT/kv_${kind}_${blocks}.json" > "$OUT/kv_${kind}_${blocks}.txt" 2>&1
      echo "bench $kind $blocks: exit $?"; tail -8 "$OUT/kv_${kind}_${blocks}.txt"
    done
  done
  # Which UCX transport moved the VRAM (cuda_ipc, not "software emulation over tcp"), for one 256-block read.
  UCX_PROTO_INFO=y timeout 120 baton --log-level WARNING bench kv-transfer --device cuda --layout llama-8b \
    --sizes 256 --repeats 2 --transports nixl > "$OUT/ucx_proto_info.txt" 2>&1
  grep -iE "cuda_ipc|emulation|tcp" "$OUT/ucx_proto_info.txt" | sort | uniq -c | sort -rn | head -12
}

tests() {
  timeout 420 python3 -m pytest -q -p no:cacheprovider tests/worker/test_kv_transfer_gpu.py \
    tests/worker/test_kv_descriptors.py tests/worker/test_kv_transfer.py tests/gateway/test_disaggregated_gpu.py \
    -s 2>&1 | tee "$OUT/pytest.txt" | tail -25
}

make_model() {
  [ -f "$MODEL/config.json" ] || python3 deploy/gpu-check/make8b.py "$MODEL" > "$OUT/make8b.txt" 2>&1
}

exact() {
  make_model
  BATON_GPU_CHECK_MODEL=$MODEL timeout 480 python3 -m pytest -q -p no:cacheprovider -s \
    tests/gateway/test_disaggregated_gpu.py 2>&1 | tee "$OUT/exact_8b.txt" | tail -25
}

serve_and_load() {  # MODE TRANSPORT: one stack, its memory per process, one sweep
  local mode=$1 transport=$2 port=18000 log="$OUT/serve_$1.log"
  baton serve --model "$MODEL" --mode "$mode" --kv-transport "$transport" --port $port > "$log" 2>&1 &
  local pid=$!
  for _ in $(seq 300); do grep -q "baton serve ready" "$log" && break; sleep 1; done
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv > "$OUT/memory_$mode.csv"
  timeout 200 baton loadtest --url "http://127.0.0.1:$port/v1" --model 8b --workload synthetic --tokenizer "$MODEL" \
    --input-len 2000 --output-len 128 --max-len 4096 --sweep 1,2 --duration 40 --drain-timeout 30 --warmup 4 \
    --no-progress --output-json "$OUT/loadtest_$mode.json" > "$OUT/loadtest_$mode.txt" 2>&1
  echo "loadtest $mode: exit $?"; tail -6 "$OUT/loadtest_$mode.txt"
  kill -TERM $pid; wait $pid
}

loadtest() {
  make_model
  serve_and_load colocated "${KV_TRANSPORT:-cuda_ipc}"
  serve_and_load disaggregated "${KV_TRANSPORT:-cuda_ipc}"
  baton loadtest-compare colocated="$OUT/loadtest_colocated.json" \
    disaggregated="$OUT/loadtest_disaggregated.json" | tee "$OUT/loadtest_compare.md"
}

setup
for step in "$@"; do "$step"; done
