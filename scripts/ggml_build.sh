#!/usr/bin/env bash
# Build ggml's CPU library (shared objects) for scripts/ggml_bench.py, from the ggml-py sdist on PyPI, which
# vendors ggml. The only network access is pip's download of that sdist.
#
#   scripts/ggml_build.sh DIR [JOBS]
#
# leaves DIR/build/src/libggml-base.so and DIR/build/src/libggml-cpu.so (Release, GGML_NATIVE=ON: -march=native,
# no BLAS, no GPU backends, OpenMP as ggml's default) and DIR/ggml_version.txt (the sdist, ggml's version and the
# llama.cpp commit its sources were last synced from). JOBS (default 2) is make's -j.
set -euo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: $0 DIR [JOBS]  (DIR: a folder outside the repository for the sdist and the build)" >&2
    exit 2
fi
DIR=$(mkdir -p "$1" && cd "$1" && pwd)
JOBS=${2:-2}
SDIST_VERSION=0.10.1

cd "$DIR"
if [[ ! -f "ggml_py-$SDIST_VERSION.tar.gz" ]]; then
    python -m pip download --no-deps --no-binary :all: "ggml-py==$SDIST_VERSION" -d "$DIR"
fi
rm -rf "ggml_py-$SDIST_VERSION"
tar xzf "ggml_py-$SDIST_VERSION.tar.gz"
SRC="$DIR/ggml_py-$SDIST_VERSION/vendor/ggml"
for op in ggml_ssm_scan ggml_gated_delta_net; do
    grep -q "$op(" "$SRC/include/ggml.h" || echo "note: this ggml has no $op" >&2
done

cmake -S "$SRC" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON \
    -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_BUILD_TESTS=OFF \
    -DGGML_BUILD_EXAMPLES=OFF
make -C "$DIR/build" -j"$JOBS" ggml-cpu

version=$(sed -n 's/^set(GGML_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\))/\2/p' "$SRC/CMakeLists.txt" | paste -sd.)
{
    echo "sdist: ggml-py $SDIST_VERSION"
    echo "ggml: $version"
    echo "llama.cpp sync commit: $(cat "$SRC/scripts/sync-llama.last" 2>/dev/null || echo unknown)"
} > "$DIR/ggml_version.txt"
cat "$DIR/ggml_version.txt"
echo "library: $DIR/build/src (pass it to scripts/ggml_bench.py --lib)"
