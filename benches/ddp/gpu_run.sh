#!/usr/bin/env bash
# Data-parallel training on a GPU machine with one or more GPUs (issues 22 and 23).
#
#   benches/ddp/gpu_run.sh package        # here: build, strip, copy into dist/ddp
#   dist/ddp/gpu_run.sh remote [bench]    # there (the device tool's kinds with several GPUs)
#
# remote: the four collectives and a DistributedDataParallel run against one process on the
# whole batch, through NCCL, on 1..N GPUs (distributed_check); the same with rank 1 exiting
# in the middle, started without the launcher so that the survivors must fail on their own
# (GENESIS_DIST_TIMEOUT=15); the digits CNN and the char-level transformer on N GPUs. With `bench`: the Qwen2.5-0.5B-shaped
# SFT step (8 x 1024 tokens per GPU) on 1 GPU and on N GPUs, Genesis and PyTorch DDP
# (torchrun, NCCL) one after the other on the same machine, then Genesis over the host ring.
# Every step writes to $OUT as it goes and has its own time limit. QUICK=1 (for a short lease
# on a bigger machine): distributed_check on all N GPUs only, no failure test, no host ring. Keep NCCL_NVLS_ENABLE=0
# and the related variables as the machine sets them (NVLink multicast must stay off).
set -uo pipefail
case "${1:-}" in
package)
    root=$(cd "$(dirname "$0")/../.." && pwd)
    dist=$root/dist/ddp
    target=${CARGO_TARGET_DIR:-$root/target}
    (cd "$root" && cargo build --release -p genesis-backend-cuda -p genesis-run \
        && cargo build --release -p genesis-core --example distributed_check --example sft_bench \
            --example train_digits --example train_char_lm) || exit 1
    mkdir -p "$dist"
    cp "$target/release/libgenesis_backend_cuda.so" "$target/release/genesis-run" \
        "$target/release/examples/distributed_check" "$target/release/examples/sft_bench" \
        "$target/release/examples/train_digits" "$target/release/examples/train_char_lm" "$dist/"
    (cd "$dist" && strip libgenesis_backend_cuda.so genesis-run distributed_check sft_bench train_digits train_char_lm)
    cp "$root/benches/ddp/gpu_run.sh" "$root/benches/sft/bench_torch.py" "$dist/"
    ls -la "$dist"
    ;;
remote)
    cd "$(dirname "$0")"
    export GENESIS_PLUGIN_PATH=$PWD GENESIS_CUDA_CACHE=/tmp/genesis-kernel-cache
    out=${OUT:-/tmp/genesis-out}
    mkdir -p "$out"
    log=$out/ddp.log
    n=$(nvidia-smi -L | wc -l)
    {
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
        env | grep -E "^NCCL_|MULTICAST|NVLS" | sort
        first=1
        [ -n "${QUICK:-}" ] && first=$n
        for w in $(seq "$first" "$n"); do
            echo "== distributed_check, $w rank(s)"
            GENESIS_DIST_TIMEOUT=60 timeout 300 ./genesis-run --nproc-per-node "$w" ./distributed_check --device cuda
            echo "rc=$?"
        done
        if [ "$n" -ge 2 ] && [ -z "${QUICK:-}" ]; then
            echo "== distributed_check, 2 ranks without the launcher, rank 1 exits in the middle (timeout 15 s)"
            start=$SECONDS
            pids=()
            for r in 0 1; do
                RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29622 GENESIS_DIST_TIMEOUT=15 \
                    timeout 120 ./distributed_check --device cuda --fail-rank 1 >"$out/fail$r.log" 2>&1 &
                pids+=($!)
            done
            wait "${pids[0]}"; rc0=$?
            wait "${pids[1]}"; rc1=$?
            echo "took $((SECONDS - start)) s; rank 0 exited with $rc0 (3: stopped with an error), rank 1 with $rc1"
            tail -2 "$out/fail0.log"
        fi
        echo "== train_digits CNN, $n ranks"
        timeout 300 ./genesis-run --nproc-per-node "$n" ./train_digits --device cuda --model cnn --out "$out/digits"
        echo "rc=$?"
        echo "== train_char_lm, $n ranks"
        timeout 300 ./genesis-run --nproc-per-node "$n" ./train_char_lm --device cuda --out "$out/char_lm" | grep -v "^\[rank0\]: step"
        echo "rc=$?"
    } 2>&1 | grep -v "genesis-cuda: compiled" >>"$log"
    [ "${2:-}" = bench ] || exit 0
    steps=${STEPS:-10}
    {
        echo "== Qwen2.5-0.5B shape, 8 x 1024 tokens per GPU, bf16 autocast, $steps steps"
        timeout 300 ./sft_bench --device cuda --steps "$steps" | tail -1
        timeout 300 python3 bench_torch.py --steps "$steps" | tail -1
        timeout 300 ./genesis-run --nproc-per-node "$n" ./sft_bench --device cuda --steps "$steps" | grep '"system"'
        timeout 300 torchrun --nproc-per-node "$n" bench_torch.py --steps "$steps" | grep '"system"'
        [ -n "${QUICK:-}" ] || GENESIS_DIST_TRANSPORT=host timeout 300 ./genesis-run --nproc-per-node "$n" ./sft_bench --device cuda --steps 3 \
            | grep '"system"' | sed 's/"genesis"/"genesis, host ring"/'
    } 2>&1 | tee -a "$out/scaling.jsonl" >>"$log"
    ;;
*)
    echo "usage: $0 package | remote [bench]" >&2
    exit 2
    ;;
esac
