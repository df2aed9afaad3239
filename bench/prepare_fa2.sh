#!/usr/bin/env bash
# Prepare the FA-2 (flash-attn 2.8.3, source build) payload for a GPU machine without internet.
# Run on a machine with PyPI access, from the checkout root:   bash bench/prepare_fa2.sh
#
# Writes .devcarry/fa2/ (ignored by git through .git/info/exclude; ~10 MB):
#   flash_attn-2.8.3.tar.gz   the sdist (8.4 MB, CUTLASS 4.0 inside; PyPI has no wheel for
#                             torch 2.11 + CUDA 13, so the GPU machine compiles it)
#   *.whl                     what flash-attn's setup.py imports or requires to build
#                             (packaging, wheel, psutil, ninja, setuptools) and what flash_attn
#                             imports at run time (einops). The GPU image has all of them
#                             (docs/benchmarks.md, KINDS.md's package list): bench/gpu_fa2_build.sh
#                             installs a carried one only where the image lacks it, so these
#                             are a fallback, never an override of the image's versions.
#   SHA256SUMS                checked by gpu_fa2_build.sh before it unpacks anything
#
# Then, on the GPU (carry [".devcarry/fa2"]): bash bench/gpu_fa2_build.sh start, status, wait,
# test (that script's header; docs/benchmarks.md, "FA-2 build (prepared, not yet run)").
#
# Sources of the sdist: FA2_SDIST=/path/to/flash_attn-2.8.3.tar.gz (default: /tmp/fa2dl/ if
# there, else `pip download --no-binary :all: --no-deps flash-attn==2.8.3`).
set -euo pipefail
PIP=${PIP:-python3 -m pip}
ROOT=$(pwd)
OUTD=$ROOT/.devcarry/fa2
VERSION=2.8.3
[ -d .git ] || { echo "prepare_fa2.sh: run from the checkout root (no .git here: $ROOT)" >&2; exit 2; }
grep -qx '/.devcarry/' .git/info/exclude 2>/dev/null || echo '/.devcarry/' >> .git/info/exclude
rm -rf "$OUTD" && mkdir -p "$OUTD"

SDIST=${FA2_SDIST:-/tmp/fa2dl/flash_attn-$VERSION.tar.gz}
if [ -f "$SDIST" ]; then
  cp "$SDIST" "$OUTD/"
else
  echo "no $SDIST: pip download of the sdist"
  # pip runs the sdist's setup.py to read its requirements, and that imports torch: without build
  # isolation, with a Python that has torch (the checkout's .venv when there is one), and the CUDA
  # build skipped (only the metadata is read here)
  DLPY=python3; [ -x .venv/bin/python ] && DLPY=.venv/bin/python
  FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE $DLPY -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
    -d "$OUTD" "flash-attn==$VERSION"
fi
[ -f "$OUTD/flash_attn-$VERSION.tar.gz" ] || { echo "prepare_fa2.sh: flash_attn-$VERSION.tar.gz missing" >&2; exit 1; }
# the sdist must hold CUTLASS (setup.py asserts csrc/cutlass/include/cutlass/cutlass.h); no grep -q:
# it would close the pipe early and tar's SIGPIPE fails the pipeline under pipefail
tar -tzf "$OUTD/flash_attn-$VERSION.tar.gz" | grep 'csrc/cutlass/include/cutlass/cutlass.h$' > /dev/null \
  || { echo "prepare_fa2.sh: the sdist has no csrc/cutlass (not the PyPI sdist?)" >&2; exit 1; }

# wheels for CPython 3.12 on manylinux x86_64 (pip matches each platform tag exactly: name several)
TARGET="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64"
NINJA_WHL=$(ls /tmp/fa2dl/ninja-*.whl 2>/dev/null | head -1 || true)
if [ -n "$NINJA_WHL" ]; then cp "$NINJA_WHL" "$OUTD/"; else $PIP download -q $TARGET -d "$OUTD" ninja; fi
$PIP download -q $TARGET -d "$OUTD" packaging wheel psutil einops setuptools

(cd "$OUTD" && sha256sum ./* > SHA256SUMS)
ls -l "$OUTD"
du -cb "$OUTD"/* | tail -1 | sed 's/total/bytes in .devcarry\/fa2 (one device call carries at most 64 MiB with the tree)/'
git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | sed 's/total/bytes of tracked files (travel with every call)/'
