#!/usr/bin/env bash
# Qwen2 on the GPU machine (which has PyTorch and transformers but no Rust).
#
#   benches/qwen2/gpu_run.sh package        # here: build, strip, copy into dist/qwen2
#   benches/qwen2/gpu_run.sh remote         # there, from the repository root: everything below
#
# remote: the fixture tests on cuda in f32 and bf16; folders saved by Genesis loaded by
# transformers; the chat example; the decode benchmark, Genesis then transformers on the same
# GPU (never both at once). Logs and tables go to $OUT (default /tmp/genesis-out).
set -uo pipefail
. "$(dirname "$0")/../gpu_common.sh" qwen2
case "${1:-}" in
package)
    build_release --features text --example chat --example qwen2_bench
    dist_test qwen2_fixtures --features text
    dist_examples chat qwen2_bench
    ;;
remote)
    remote_start
    export GENESIS_QWEN2_FIXTURES=$root/tests/models/qwen2
    if ! "$dist/chat" --model tests/models/qwen2/tiny-tied --device cuda --ids 1,2 --max-new-tokens 2 >/dev/null 2>"$out/probe.log"; then
        cat "$out/probe.log"
        GENESIS_CUDA_LIB_DIR=$(find / -xdev \( -name 'libnvrtc.so*' -o -name 'libcublas.so*' \) -printf '%h\n' 2>/dev/null | sort -u | paste -sd:)
        export GENESIS_CUDA_LIB_DIR
        echo "retrying with GENESIS_CUDA_LIB_DIR=$GENESIS_CUDA_LIB_DIR"
    fi
    echo "== fixture tests on cuda, f32 and bf16"
    GENESIS_TEST_DEVICE=cuda GENESIS_TEST_DTYPES=f32,bf16 GENESIS_QWEN2_SAVE_DIR=$out/saved \
        "$dist/qwen2_fixtures" --test-threads=1 --nocapture 2>&1 | tee "$out/fixtures-cuda.txt" | grep -E "^test |result|logit|greedy|panicked"
    echo "== folders saved by Genesis, loaded by transformers"
    python3 benches/qwen2/check_saved.py "$out/saved" tests/models/qwen2 2>&1 | tee "$out/check-saved.txt" | grep -v Warning
    echo "== chat on cuda"
    for dtype in f32 bf16; do
        "$dist/chat" --model tests/models/qwen2/tiny-sharded --device cuda --dtype $dtype --greedy \
            --prompt "Tell me about the lighthouse." --max-new-tokens 24 --json 2>&1 | tee "$out/chat-$dtype.txt" | cut -c1-300
    done
    echo "== decode benchmark: Qwen2.5-0.5B shape, bf16, prompt 512, 256 new tokens, batch 1"
    "$dist/qwen2_bench" --device cuda --dtype bf16 --prompt 512 --new 256 2>&1 | tee "$out/bench.jsonl"
    python3 benches/qwen2/bench_torch.py --prompt 512 --new 256 2>&1 | grep '^{' | tee -a "$out/bench.jsonl"
    ;;
*)
    sed -n 2,9p "$0"
    exit 2
    ;;
esac
