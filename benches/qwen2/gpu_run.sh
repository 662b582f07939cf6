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
root=$(cd "$(dirname "$0")/../.." && pwd)
dist=$root/dist/qwen2
case "${1:-}" in
package)
    target=${CARGO_TARGET_DIR:-$root/target}
    (cd "$root" && cargo build --release -p genesis-backend-cuda \
        && cargo build --release -p genesis-core --features text --example chat --example qwen2_bench) || exit 1
    test_bin=$(cd "$root" && cargo test --release -p genesis-core --features text --test qwen2_fixtures --no-run \
        --message-format=json 2>/dev/null | grep -o '"executable":"[^"]*qwen2_fixtures[^"]*"' | cut -d'"' -f4 | tail -1)
    [ -x "$test_bin" ] || { echo "qwen2_fixtures test binary not found"; exit 1; }
    mkdir -p "$dist"
    cp "$target/release/libgenesis_backend_cuda.so" "$target/release/examples/chat" \
        "$target/release/examples/qwen2_bench" "$dist/"
    cp "$test_bin" "$dist/qwen2_fixtures"
    (cd "$dist" && strip libgenesis_backend_cuda.so chat qwen2_bench qwen2_fixtures)
    ls -la "$dist"
    ;;
remote)
    out=${OUT:-/tmp/genesis-out}
    mkdir -p "$out"
    cd "$root"
    export GENESIS_CUDA_CACHE=/tmp/genesis-kernel-cache GENESIS_QWEN2_FIXTURES=$root/tests/models/qwen2
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
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
