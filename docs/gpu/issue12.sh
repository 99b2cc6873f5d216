#!/bin/bash
# Issue 12's GPU checks, run on the device machine from the repository root (see docs/gpu-checks.md).
# Usage: bash docs/gpu/issue12.sh kernels|decode|throughput   (each fits one 10-minute device call)
set -x
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
M=/tmp/m8b
case "$1" in
  kernels)
    python3 -m pytest -q -p no:cacheprovider tests/kernels tests/engine/test_cuda_graphs.py \
      tests/engine/test_bench_decode.py 2>&1 | tail -30
    python3 docs/gpu/decode_attention_speed.py $OUT/decode_attention.json
    ;;
  decode)
    python3 deploy/gpu-check/make8b.py $M > /dev/null
    for g in on off; do
      python3 -m baton.services.cli.main bench decode-step --model $M --batch-sizes 1,32,128 --context 2048 \
        --graphs $g --max-num-seqs 128 --output-json $OUT/decode_step_graphs_$g.json 2>&1 | grep -v " INFO "
    done
    ;;
  throughput)
    python3 deploy/gpu-check/make8b.py $M > /dev/null
    python3 docs/gpu/graphs_token_exact.py $M $OUT/token_exact.json 2>&1 | grep -v " INFO "
    for g in "" "--enforce-eager"; do
      python3 -m baton.services.cli.main bench throughput --model $M --num-prompts 512 --input-len 128 \
        --output-len 512 --range-ratio 0 --max-num-seqs 256 $g \
        --output-json $OUT/throughput${g:+_eager}.json 2>&1 | grep -v " INFO "
    done
    ;;
esac
