#!/usr/bin/env bash
# Package the CUDA plugin and its checker for the GPU machine, and run them there.
#
#   backend-cuda/scripts/gpu_run.sh package DEST   # on the build machine: build, strip, copy to DEST
#   dist-cuda/gpu_run.sh remote                    # on the GPU machine, from the folder's parent
#   dist-cuda/gpu_run.sh conformance [TIER]        # the conformance harness on the CUDA plugin
#   dist-cuda/gpu_run.sh examples                  # the training examples with --device cuda
#   dist-cuda/gpu_run.sh bench [SUBSTR]            # on the GPU machine: the benchmark alone
#
# The GPU machine has the driver, the CUDA toolkit and PyTorch but no Rust: `package` builds
# release binaries here; `remote` runs the checker twice (the second start must compile no
# kernel: the disk cache is warm), then `bench`: cuda_bench and torch_bench.py one after the
# other on the same GPU, the combined table in $OUT/bench.md. Logs go to $OUT when set.
set -uo pipefail
case "${1:-}" in
package)
    dest=${2:?destination folder}
    root=$(cd "$(dirname "$0")/../.." && pwd)
    target=${CARGO_TARGET_DIR:-$root/target}
    (cd "$root" && cargo build --release -p genesis-backend-cuda -p genesis-conformance \
        && cargo build --release -p genesis-backend-cuda --example cuda_check --example cuda_bench \
        && cargo build --release -p genesis-core --example train_digits --example train_char_lm) || exit 1
    mkdir -p "$dest"
    cp "$target/release/libgenesis_backend_cuda.so" "$target/release/examples/cuda_check" \
        "$target/release/examples/cuda_bench" "$target/release/genesis-conformance" \
        "$target/release/examples/train_digits" "$target/release/examples/train_char_lm" "$dest/"
    (cd "$dest" && strip libgenesis_backend_cuda.so cuda_check cuda_bench genesis-conformance train_digits train_char_lm)
    cp "$root/backend-cuda/scripts/gpu_run.sh" "$root/backend-cuda/scripts/torch_bench.py" \
        "$root/tests/conformance/expectations/cuda.txt" "$dest/"
    ls -la "$dest"
    ;;
remote)
    dir=$(cd "$(dirname "$0")" && pwd)
    out=${OUT:-/tmp/genesis-out}
    mkdir -p "$out"
    export GENESIS_CUDA_CACHE=/tmp/genesis-kernel-cache
    rm -rf "$GENESIS_CUDA_CACHE"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
    echo "CUDA libraries on this machine:"
    find / -xdev \( -name 'libnvrtc.so*' -o -name 'libcublas.so*' \) 2>/dev/null | head -10
    echo "== first start (compiles kernels)"
    GENESIS_CUDA_VERBOSE=1 "$dir/cuda_check" "$dir/libgenesis_backend_cuda.so" >"$out/check1.log" 2>&1
    echo "rc=$?" | tee -a "$out/check1.log"
    if grep -q "so.13 not found" "$out/check1.log"; then
        echo "our library search missed a library; retrying with GENESIS_CUDA_LIB_DIR"
        GENESIS_CUDA_LIB_DIR=$(find / -xdev \( -name 'libnvrtc.so*' -o -name 'libcublas.so*' \) -printf '%h\n' 2>/dev/null | sort -u | paste -sd:)
        export GENESIS_CUDA_LIB_DIR
        GENESIS_CUDA_VERBOSE=1 "$dir/cuda_check" "$dir/libgenesis_backend_cuda.so" >"$out/check1.log" 2>&1
        echo "rc=$?" | tee -a "$out/check1.log"
    fi
    grep -E "FAIL|passed|failed \(|claims|op checks took|out-of-memory|allocator" "$out/check1.log" | head -150
    echo "kernel modules compiled on the first start: $(grep -c 'genesis-cuda: compiled' "$out/check1.log")"
    echo "== second start (must compile nothing)"
    GENESIS_CUDA_VERBOSE=1 "$dir/cuda_check" "$dir/libgenesis_backend_cuda.so" >"$out/check2.log" 2>&1
    echo "rc=$?" | tee -a "$out/check2.log"
    echo "kernel modules compiled on the second start: $(grep -c 'genesis-cuda: compiled' "$out/check2.log")"
    grep -E "FAIL|passed \(|failed \(" "$out/check2.log" | head -20
    ls "$GENESIS_CUDA_CACHE" | head -20
    echo "reduce kernels in the cached float32 cubin: $(/usr/local/cuda/bin/cuobjdump -symbols "$GENESIS_CUDA_CACHE"/elementwise_float32-*.cubin 2>&1 | grep -c reduce_)"
    if grep -q "named symbol not found" "$out/check1.log"; then
        echo "== kernels not found: once more with CUDA_MODULE_LOADING=EAGER"
        rm -rf "$GENESIS_CUDA_CACHE"
        CUDA_MODULE_LOADING=EAGER "$dir/cuda_check" "$dir/libgenesis_backend_cuda.so" >"$out/eager.log" 2>&1
        grep -E "passed \(|failed \(" "$out/eager.log"; grep FAIL "$out/eager.log" | grep -v "pow int32" | head -5
    fi
    echo "== planted kernel fault (must be an error naming the op, not a hang)"
    GENESIS_CUDA_PLANT_FAULT=exp timeout 60 "$dir/cuda_check" "$dir/libgenesis_backend_cuda.so" --fault 2>&1 | tee "$out/fault.log"
    echo "rc=${PIPESTATUS[0]}"
    "$0" bench
    ;;
bench)
    # Genesis first, then PyTorch, never both at once: each has the GPU to itself.
    dir=$(cd "$(dirname "$0")" && pwd)
    out=${OUT:-/tmp/genesis-out}
    mkdir -p "$out"
    export GENESIS_CUDA_CACHE=${GENESIS_CUDA_CACHE:-/tmp/genesis-kernel-cache}
    filter=()
    [ -n "${2:-}" ] && filter=(--filter "$2")
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$out/gpu.txt"
    echo "== genesis (cuda_bench)"
    "$dir/cuda_bench" "$dir/libgenesis_backend_cuda.so" --json "$out/genesis.json" ${filter[@]+"${filter[@]}"} 2>&1 | tee "$out/bench_genesis.log"
    echo "rc=${PIPESTATUS[0]}"
    echo "== pytorch (torch_bench.py) and the combined table"
    PYTHONUNBUFFERED=1 python3 "$dir/torch_bench.py" --json "$out/torch.json" --genesis "$out/genesis.json" \
        --out "$out/bench.md" ${filter[@]+"${filter[@]}"} 2>&1 | tee "$out/bench_torch.log"
    echo "rc=${PIPESTATUS[0]}"
    ;;
conformance)
    # The acceptance test of the plugin: every suite at the requested tier (default full).
    dir=$(cd "$(dirname "$0")" && pwd)
    out=${OUT:-/tmp/genesis-out}
    mkdir -p "$out"
    export GENESIS_CUDA_CACHE=${GENESIS_CUDA_CACHE:-/tmp/genesis-kernel-cache}
    start=$SECONDS
    "$dir/genesis-conformance" --backend "$dir/libgenesis_backend_cuda.so" --tier "${2:-full}" \
        --expectations "$dir/cuda.txt" \
        --json "$out/conformance-cuda.json" --junit "$out/conformance-cuda.xml" >"$out/conformance-cuda.txt" 2>&1
    echo "conformance rc=$? in $((SECONDS - start)) s"
    grep -E "^(FAIL|ERROR|CRASH|TIMEOUT)|Summary|Verdict|suites:" "$out/conformance-cuda.txt" | head -60
    ;;
examples)
    # The plugin next to the example binaries is found by the loader's executable-directory search.
    dir=$(cd "$(dirname "$0")" && pwd)
    out=${OUT:-/tmp/genesis-out}
    mkdir -p "$out"
    export GENESIS_CUDA_CACHE=${GENESIS_CUDA_CACHE:-/tmp/genesis-kernel-cache}
    (cd "$out" && time "$dir/train_digits" --device cuda --out digits) 2>&1 | tail -12
    (cd "$out" && time "$dir/train_char_lm" --device cuda --out char_lm ${CHAR_LM_ARGS:-}) 2>&1 | tail -30
    ;;
*)
    echo "usage: $0 package DEST | remote | bench [SUBSTR] | conformance [TIER] | examples" >&2
    exit 2
    ;;
esac
