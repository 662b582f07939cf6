#!/usr/bin/env bash
# ResNet on the GPU machine (which has PyTorch and torchvision but no Rust).
#
#   benches/resnet/gpu_run.sh package        # here: build, strip, copy into dist/resnet
#   benches/resnet/gpu_run.sh remote         # there, from the repository root: everything below
#
# remote: the torchvision fixture tests on cuda, with the full-size resnet50 fixture made
# there (tests/models/resnet/make_fixtures.py --resnet50); the training example on the
# generated shapes with bf16 autocast; the ResNet-50 training-step benchmark, Genesis then
# PyTorch on the same GPU (never both at once), and a profile of Genesis' step. Logs go to
# $OUT (default /tmp/genesis-out).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dist=$root/dist/resnet
case "${1:-}" in
package)
    target=${CARGO_TARGET_DIR:-$root/target}
    (cd "$root" && cargo build --release -p genesis-backend-cuda \
        && cargo build --release -p genesis-core --example train_resnet --example resnet_bench) || exit 1
    test_bin=$(cd "$root" && cargo test --release -p genesis-core --test resnet_fixtures --no-run \
        --message-format=json 2>/dev/null | grep -o '"executable":"[^"]*resnet_fixtures[^"]*"' | cut -d'"' -f4 | tail -1)
    [ -x "$test_bin" ] || { echo "resnet_fixtures test binary not found"; exit 1; }
    mkdir -p "$dist"
    cp "$target/release/libgenesis_backend_cuda.so" "$target/release/examples/train_resnet" \
        "$target/release/examples/resnet_bench" "$dist/"
    cp "$test_bin" "$dist/resnet_fixtures"
    (cd "$dist" && strip libgenesis_backend_cuda.so train_resnet resnet_bench resnet_fixtures)
    ls -la "$dist"
    ;;
remote)
    out=${OUT:-/tmp/genesis-out}
    mkdir -p "$out"
    cd "$root"
    export GENESIS_CUDA_CACHE=/tmp/genesis-kernel-cache
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
    echo "== fixtures: the committed ones and a full-size resnet50, on cuda"
    fixtures=/tmp/resnet-fixtures
    mkdir -p $fixtures && cp tests/models/resnet/*.safetensors $fixtures/
    python3 tests/models/resnet/make_fixtures.py --out /tmp/resnet-regen --resnet50 $fixtures/resnet50.safetensors 2>&1 | tail -1
    GENESIS_TEST_DEVICE=cuda GENESIS_RESNET_FIXTURES=$fixtures "$dist/resnet_fixtures" --test-threads=1 --nocapture \
        2>&1 | tee "$out/fixtures-cuda.txt" | grep -E "^test |result|torchvision|panicked"
    echo "== train_resnet on cuda (shapes, bf16 autocast)"
    "$dist/train_resnet" --device cuda --out /tmp/train_resnet 2>&1 | grep -v '^\s*$' | tail -4 | tee "$out/train.txt"
    for arch in ${ARCHS:-resnet50}; do
        echo "== $arch training step, batch ${BATCH:-256} at 224x224, bf16 autocast: Genesis, then PyTorch"
        "$dist/resnet_bench" --device cuda --arch $arch --batch ${BATCH:-256} --steps ${STEPS:-20} 2>&1 | tee -a "$out/bench.jsonl"
        python3 benches/resnet/bench_torch.py --arch $arch --batch ${BATCH:-256} --steps ${STEPS:-20} 2>&1 | tee -a "$out/bench.jsonl"
        python3 benches/resnet/bench_torch.py --arch $arch --batch ${BATCH:-256} --steps ${STEPS:-20} --memory-format contiguous 2>&1 | tee -a "$out/bench.jsonl"
    done
    echo "== profile of Genesis' step"
    "$dist/resnet_bench" --device cuda --batch ${BATCH:-256} --steps 2 --warmup 2 --profile 2 2>&1 | tee "$out/profile.txt" | head -60
    ;;
*)
    sed -n 2,10p "$0"
    exit 2
    ;;
esac
