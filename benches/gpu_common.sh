# Sourced by benches/{qwen2,resnet,sft}/gpu_run.sh, whose `package` and `remote` steps start
# alike: `. "$(dirname "$0")/../gpu_common.sh" NAME` sets `root` (the repository) and `dist`
# (dist/NAME, where `package` puts the stripped binaries that `remote` runs).
# shellcheck shell=bash

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dist=$root/dist/$1
target=${CARGO_TARGET_DIR:-$root/target}
# The names in $dist that `dist_examples` strips: the test binary `dist_test` copied, if any.
dist_names=()

# build_release ARGS...: the CUDA plugin, then `cargo build --release -p genesis-core ARGS...`
# (the examples a bench runs); exits on a failed build.
build_release() {
    (cd "$root" && cargo build --release -p genesis-backend-cuda \
        && cargo build --release -p genesis-core "$@") || exit 1
}

# dist_test NAME ARGS...: builds genesis-core's integration test NAME (release, with cargo ARGS
# such as `--features text`) and copies its binary into $dist as NAME.
dist_test() {
    local name=$1 bin
    shift
    bin=$(cd "$root" && cargo test --release -p genesis-core "$@" --test "$name" --no-run \
        --message-format=json 2>/dev/null | grep -o "\"executable\":\"[^\"]*$name[^\"]*\"" | cut -d'"' -f4 | tail -1)
    [ -x "$bin" ] || { echo "$name test binary not found"; exit 1; }
    mkdir -p "$dist"
    cp "$bin" "$dist/$name"
    dist_names+=("$name")
}

# dist_examples EXAMPLE...: copies the CUDA plugin and the release examples into $dist, strips
# them (and the test binary) and lists the folder.
dist_examples() {
    local e
    mkdir -p "$dist"
    cp "$target/release/libgenesis_backend_cuda.so" "$dist/"
    for e in "$@"; do cp "$target/release/examples/$e" "$dist/"; done
    (cd "$dist" && strip libgenesis_backend_cuda.so "$@" "${dist_names[@]}")
    ls -la "$dist"
}

# remote_start: on the GPU machine, $out (default /tmp/genesis-out) made, the working folder
# the repository, the kernel cache set and the GPU recorded in $out/gpu.txt.
remote_start() {
    out=${OUT:-/tmp/genesis-out}
    mkdir -p "$out"
    cd "$root" || exit 1
    export GENESIS_CUDA_CACHE=/tmp/genesis-kernel-cache
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
}
