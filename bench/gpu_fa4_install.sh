#!/usr/bin/env bash
# FA-4 on the GPU, device call 1 of 2: unpack the nvidia-cutlass-dsl-libs-cu13 payload.
#   carry: [".devcarry/fa4_libs"]        command: bash bench/gpu_fa4_install.sh
# Made by bench/prepare_fa4.sh (libs.tar.xz, ~61 MiB: the whole call's tree must stay under
# 64 MiB, so the small wheels come in call 2). Unpacked into /tmp/fa4_libs, NOT into the site
# folder: call 2 installs the wheels with `pip --target /tmp/site` into a fresh folder (pip
# --target skips, or with --upgrade deletes, a top-level folder that already exists, and the
# libs share nvidia_cutlass_dsl/ with two of the wheels), then copies these files in.
# /tmp survives only while the machine stays warm: send call 2 right after this one returns.
set -euo pipefail
LIBS=${FA4_LIBS:-/tmp/fa4_libs}
T0=$(date +%s.%N)
rm -rf "$LIBS" && mkdir -p "$LIBS"
if command -v xz > /dev/null; then
  xz -dc .devcarry/fa4_libs/libs.tar.xz | tar -xf - -C "$LIBS"
else  # no xz binary: Python's lzma
  python3 -c "import sys, tarfile; tarfile.open(sys.argv[1], 'r:xz').extractall(sys.argv[2])" \
    .devcarry/fa4_libs/libs.tar.xz "$LIBS"
fi
T1=$(date +%s.%N)
echo "unpacked $(du -sb "$LIBS" | cut -f1) bytes into $LIBS in $(python3 -c "print(round($T1-$T0,1))") s:"
find "$LIBS" -name '*.so' -printf '  %P %s\n'
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', \
torch.version.cuda, torch.cuda.get_device_name(), torch.cuda.get_device_capability())" || true
echo "now device call 2 (bench/gpu_fa4_run.sh) within the machine's 30 s warm period"
