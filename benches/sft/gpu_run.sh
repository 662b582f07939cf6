#!/usr/bin/env bash
# SFT on the GPU machine (which has PyTorch and transformers but no Rust).
#
#   benches/sft/gpu_run.sh package        # here: build, strip, copy into dist/sft
#   benches/sft/gpu_run.sh remote         # there, from the repository root: everything below
#
# remote: the SFT demonstration on cuda (bf16 autocast) with its exact-match goal; the output
# folder loaded by transformers (logits against Genesis's, and transformers' own greedy
# accuracy); the SFT step of a Qwen2.5-0.5B-shaped model at batch 8 x 1024, Genesis then
# PyTorch + transformers on the same GPU (never both at once). Logs go to $OUT.
set -uo pipefail
. "$(dirname "$0")/../gpu_common.sh" sft
case "${1:-}" in
package)
    build_release --example sft --example sft_bench --example chat
    dist_examples sft sft_bench chat
    ;;
remote)
    remote_start
    echo "== SFT demonstration on cuda (bf16 autocast)"
    model=/tmp/genesis-sft-cuda
    "$dist/sft" --device cuda --quiet --out "$model" --save-logits /tmp/genesis-sft-logits.safetensors 2>&1 | tee "$out/sft-cuda.txt"
    cp "$model/metrics.csv" "$out/sft-cuda-metrics.csv"; cp "$model/curves.png" "$out/sft-cuda-curves.png"
    echo "== the output folder in transformers"
    python3 benches/sft/check_logits.py "$model" /tmp/genesis-sft-logits.safetensors tests/sft/eval.jsonl 100 2>&1 \
        | grep -v Warning | tee "$out/check.txt"
    "$dist/chat" --model "$model" --device cuda --greedy --prompt "Add one 52307" --max-new-tokens 8 2>&1 | tail -3
    echo "== SFT step, Qwen2.5-0.5B shape, bf16 autocast, batch 8 x 1024"
    "$dist/sft_bench" --device cuda --batch 8 --len 1024 --steps 5 ${SFT_PROFILE:+--profile} 2>&1 | tee "$out/bench.jsonl"
    python3 benches/sft/bench_torch.py --batch 8 --len 1024 --steps 5 2>&1 | grep '^{' | tee -a "$out/bench.jsonl"
    ;;
*)
    sed -n 2,9p "$0"
    exit 2
    ;;
esac
