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
. "$(dirname "$0")/../gpu_common.sh" resnet
case "${1:-}" in
package)
    build_release --example train_resnet --example resnet_bench
    dist_test resnet_fixtures
    dist_examples train_resnet resnet_bench
    ;;
remote)
    remote_start
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
