#!/usr/bin/env bash
# Issue 32's GPU checks in ONE device call, in priority order, inside a time budget (a session is lent about
# 15 minutes of device time, machine start included): each step runs only if its usual time still fits, under
# a timeout, and writes its figures to $OUT at once, so a call cut short still brings back what it measured.
# Prepare here with deploy/gpu-check/prepare.sh, then:
#   run(command="bash deploy/gpu-check/all.sh", carry=[".gpu"], timeout_s=560)
# GPU_CHECK_BUDGET_S (default 480) bounds the whole call; GPU_CHECK_STEPS picks steps (default: all, in order).
set -uo pipefail
# Only a few files come back from $OUT: every figure goes to /tmp/results, packed into $OUT/results.tgz after
# each step, beside summary.txt.
FINAL_OUT=${OUT:-/tmp/out}
OUT=/tmp/results
SITE=/tmp/site
MODEL=/tmp/8b
BUDGET=${GPU_CHECK_BUDGET_S:-480}
STEPS=${GPU_CHECK_STEPS:-"kernels decode kv tiers handoff throughput wave loragraphs"}
START=$SECONDS
mkdir -p "$OUT" "$FINAL_OUT"
export PYTHONUNBUFFERED=1

log() { echo "[$((SECONDS - START))s] $*" | tee -a "$FINAL_OUT/summary.txt"; }
pack() { tar czf "$FINAL_OUT/results.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")"; }
left() { echo $((BUDGET - (SECONDS - START))); }
baton() { python3 -m baton.services.cli.main --log-level WARNING "$@"; }

setup() {
  python3 -m pip install -q --no-index --no-deps --target "$SITE" .gpu/whl/*.whl
  tar xJf .gpu/nixl.txz -C "$SITE"
  export PYTHONPATH=$SITE
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.csv"
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'triton', triton.__version__, torch.cuda.get_device_name())" 2>&1 | tee "$OUT/setup.txt"
}

make_model() {
  [ -f "$MODEL/config.json" ] || python3 deploy/gpu-check/make8b.py "$MODEL" > "$OUT/make8b.txt" 2>&1
}

# step: kernels compiled against their float64 references; CUDA graphs token-exact against eager
kernels() {
  python3 -m pytest -q -p no:cacheprovider tests/kernels tests/engine/test_cuda_graphs.py \
    tests/engine/test_sampler.py > "$OUT/kernels.txt" 2>&1
  tail -3 "$OUT/kernels.txt"
  python3 docs/gpu/decode_attention_speed.py "$OUT/decode_attention.json" > /dev/null 2>&1
}

# step: decode step time against the HBM floor, 8B shape at 2k context
decode() {
  make_model
  for g in on off; do
    baton bench decode-step --model "$MODEL" --batch-sizes 1,32,128 --context 2048 --graphs $g \
      --max-num-seqs 128 --output-json "$OUT/decode_step_graphs_$g.json" > "$OUT/decode_$g.txt" 2>&1
    tail -5 "$OUT/decode_$g.txt"
  done
}

# step: KV reads between two processes' CUDA caches, cuda_ipc and NIXL. NIXL moved VRAM at 0.09 GB/s
# on 2026-11-28 (UCX fell back to copying over TCP), so it reads less, and UCX_PROTO_INFO shows which
# transport UCX chose for the VRAM.
kv() {
  baton bench kv-transfer --device cuda --layout llama-8b --sizes 16 256 1024 --repeats 5 \
    --transports cuda_ipc --blocks consecutive --output-json "$OUT/kv_cuda_ipc.json" \
    > "$OUT/kv_cuda_ipc.txt" 2>&1
  tail -5 "$OUT/kv_cuda_ipc.txt"
  UCX_PROTO_INFO=y timeout 120 bash -c "$(declare -f baton); baton bench kv-transfer --device cuda \
    --layout llama-8b --sizes 16 256 --repeats 3 --transports nixl --blocks consecutive \
    --output-json $OUT/kv_nixl.json" > "$OUT/kv_nixl.txt" 2>&1
  grep -v "NIXL INFO" "$OUT/kv_nixl.txt" | tail -5
  # decode rank 0's share of a TP 4 -> 8 hand-off, token-major against head-major caches
  timeout 120 bash -c "$(declare -f baton); baton bench kv-transfer --device cuda --layout llama-8b \
    --tp 4:8 --kv-cache-layout NHD HND --sizes 16 256 --repeats 3 --transports nixl --blocks random \
    --output-json $OUT/kv_nixl_tp.json" > "$OUT/kv_nixl_tp.txt" 2>&1
  grep -v "NIXL INFO" "$OUT/kv_nixl_tp.txt" | tail -8
}

# step: host-tier KV stores and loads through the engine's copier, 2k-token prompts, 8B shape
tiers() {
  timeout 90 python3 docs/gpu/tier_load_speed.py "$OUT/tiers.json" > "$OUT/tiers.txt" 2>&1
  tail -3 "$OUT/tiers.txt"
}

# step: the disaggregated stack on one GPU, token for token against colocated
handoff() {
  python3 -m pytest -q -p no:cacheprovider -s -rA --timeout 150 tests/worker/test_kv_transfer_gpu.py \
    tests/gateway/test_disaggregated_gpu.py > "$OUT/handoff.txt" 2>&1
  tail -5 "$OUT/handoff.txt"
}

# step: decode-heavy throughput (the issue's workload, fewer prompts to fit the budget)
throughput() {
  make_model
  baton bench throughput --model "$MODEL" --num-prompts 256 --input-len 128 --output-len 512 \
    --range-ratio 0 --max-num-seqs 256 --output-json "$OUT/throughput.json" > "$OUT/throughput.txt" 2>&1
  tail -8 "$OUT/throughput.txt"
}

# step: this wave's GPU paths: the LoRA kernel compiled against its reference, then the 8B shape's
# LoRA step cost (1/8/32 adapters against the base), the single-rank NCCL path of tensor
# parallelism, and speculation's verify overhead (random weights: nothing is accepted)
wave() {
  make_model
  python3 -m pytest -q -p no:cacheprovider tests/kernels/test_lora_bgmv.py > "$OUT/wave_lora_kernel.txt" 2>&1
  tail -2 "$OUT/wave_lora_kernel.txt"
  local common=(--model "$MODEL" --device cuda --dtype bfloat16)
  timeout 120 bash -c "$(declare -f baton); baton bench lora ${common[*]} --batch 32 --context 2048 \
    --output-json $OUT/lora.json" > "$OUT/lora.txt" 2>&1; tail -5 "$OUT/lora.txt"
  timeout 90 bash -c "$(declare -f baton); baton bench tp ${common[*]} --sizes 1 --batch-sizes 1,32 \
    --context 2048 --output-json $OUT/tp.json" > "$OUT/tp.txt" 2>&1; tail -5 "$OUT/tp.txt"
  timeout 120 bash -c "$(declare -f baton); baton bench spec ${common[*]} --batch-sizes 1,8,64 \
    --output-json $OUT/spec.json" > "$OUT/spec.txt" 2>&1; tail -5 "$OUT/spec.txt"
}

# step: LoRA inside the decode graphs: captured with adapters token-exact against eager, then the 8B shape's
# decode step with adapters (1 adapter at batch 1, 1 and 32 at batch 32, 2k context), graphs on and off
loragraphs() {
  make_model
  python3 -m pytest -q -p no:cacheprovider tests/engine/test_lora_graphs.py > "$OUT/lora_graphs_test.txt" 2>&1
  tail -2 "$OUT/lora_graphs_test.txt"
  local common=(--model "$MODEL" --device cuda --dtype bfloat16 --context 2048 --steps 10 --rounds 1)
  for eager in "" --enforce-eager; do
    for b in 1 32; do
      local counts=1 name="lora_graphs_b$b${eager:+_eager}"
      [ "$b" -gt 1 ] && counts=1,$b
      timeout 100 bash -c "$(declare -f baton); baton bench lora ${common[*]} --batch $b \
        --adapters $counts $eager --output-json $OUT/$name.json" > "$OUT/$name.txt" 2>&1
      tail -4 "$OUT/$name.txt"
    done
  done
}

# the usual seconds each step takes on an H100 (measured or estimated from its parts)
declare -A COST=([kernels]=120 [decode]=150 [kv]=150 [tiers]=40 [handoff]=120 [throughput]=150
                 [wave]=360 [loragraphs]=330)

log "setup"; setup; pack
for step in $STEPS; do
  if [ "$(left)" -lt "${COST[$step]}" ]; then
    log "skip $step: ${COST[$step]} s needed, $(left) s left"
    continue
  fi
  log "start $step"
  timeout "$(left)" bash -c "$(declare -f log left baton make_model "$step"); \
    OUT=$OUT FINAL_OUT=$FINAL_OUT MODEL=$MODEL START=$START BUDGET=$BUDGET; $step" 2>&1 \
    | tee -a "$FINAL_OUT/summary.txt"
  log "end $step: exit ${PIPESTATUS[0]}"
  pack
done
log "done"
