#!/usr/bin/env bash
# Prepare the FA-4 (flash-attn-4, CuTe DSL) payload for a GPU machine without internet.
# Run on a machine with PyPI access, from the checkout root:   bash bench/prepare_fa4.sh
#
# Writes (both under .devcarry/, ignored by git through .git/info/exclude):
#   .devcarry/fa4/*.whl              the small wheels (~10 MB): flash-attn-4 4.0.0b36,
#                                    nvidia-cutlass-dsl 4.8.1 (+ -libs-base, -libs-core),
#                                    apache-tvm-ffi, torch-c-dlpack-ext, quack-kernels; and
#                                    platformdirs, junitparser (nsa-run needs them, the image lacks them)
#   .devcarry/fa4_libs/libs.tar.xz   the contents of nvidia-cutlass-dsl-libs-cu13 4.8.1 (a 92 MB
#                                    wheel, 237 MB unpacked) as tar | xz -9 (~62 MB)
#
# A device call carries at most 64 MiB including the repository, so the payload goes in two
# calls: call 1 carries .devcarry/fa4_libs and runs bench/gpu_fa4_install.sh (unpacks into
# /tmp/site), call 2 carries .devcarry/fa4 and runs bench/gpu_fa4_run.sh (installs the small
# wheels into /tmp/site, then the FA-4 checks). docs/benchmarks.md, "FA-4 on the GPU".
#
# The GPU image already has what the wheels require besides each other (Requires-Dist read
# from each wheel): torch, einops, typing-extensions, cuda-bindings, protobuf. The default
# nvidia-cutlass-dsl requires -libs-cu12; torch there is CUDA 13, so the cu13 libs come instead
# (flash-attn-4's [cu13] extra) and every wheel is installed with --no-deps.
set -euo pipefail
PIP=${PIP:-python3 -m pip}
ROOT=$(pwd)
WH=$ROOT/.devcarry/fa4
LIBS=$ROOT/.devcarry/fa4_libs
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
grep -qx '/.devcarry/' .git/info/exclude 2>/dev/null || echo '/.devcarry/' >> .git/info/exclude
mkdir -p "$WH" "$LIBS"
TARGET="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64"
$PIP download -q $TARGET -d "$WH" \
  flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
  nvidia-cutlass-dsl-libs-core==4.8.1 'apache-tvm-ffi>=0.1.11,<0.2' torch-c-dlpack-ext quack-kernels
# nsa-run's own dependencies that the GPU image lacks (docs/benchmarks.md): for `nsa-run stage` there
$PIP download -q $TARGET -d "$WH" platformdirs junitparser
$PIP download -q $TARGET -d "$TMP" nvidia-cutlass-dsl-libs-cu13==4.8.1
mkdir "$TMP/x"
python3 -m zipfile -e "$TMP"/nvidia_cutlass_dsl_libs_cu13-4.8.1-*.whl "$TMP/x"
# the wheel's aarch64 / QNX stubs are useless on x86_64 but tiny; keep the tree as the wheel has it
(cd "$TMP/x" && tar -cf - . | xz -9 -T0 > "$LIBS/libs.tar.xz")
ls -l "$WH" "$LIBS"
du -cb "$WH"/*.whl | tail -1 | sed 's/total/bytes of small wheels (.devcarry\/fa4)/'
du -b "$LIBS/libs.tar.xz" | sed 's/\t.*/ bytes of libs.tar.xz (.devcarry\/fa4_libs)/'
git ls-files -z | xargs -0 du -cb | tail -1 | sed 's/total/bytes of tracked files (travel with every call)/'
