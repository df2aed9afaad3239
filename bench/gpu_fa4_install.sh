#!/usr/bin/env bash
# FA-4 on the GPU, device call 1 of 2: unpack the nvidia-cutlass-dsl-libs-cu13 payload.
#   carry: [".devcarry/fa4_libs"]        command: bash bench/gpu_fa4_install.sh
# Made by bench/prepare_fa4.sh (libs.tar.xz, ~61 MiB: the whole call's tree must stay under
# 64 MiB, so the small wheels come in call 2). Unpacked into /tmp/fa4_libs, NOT into the site
# folder: call 2 installs the wheels with `pip --target /tmp/site` into a fresh folder (pip
# --target skips, or with --upgrade deletes, a top-level folder that already exists, and the
# libs share nvidia_cutlass_dsl/ with two of the wheels), then copies these files in.
# /tmp survives only while the machine stays warm: send call 2 right after this one returns.
# The working tree travels with every call, so libs.tar.xz alone can pass the 64 MiB limit: then
# `bash bench/gpu_fa4_install.sh split` (here) cuts it into .devcarry/fa4_p1, .devcarry/fa4_p2 (parts
# libs.tar.xz.NN-of-MM), one device call carries each (same command); the call that completes the set
# joins and unpacks them. Parts are kept in /tmp/fa4_parts between the calls of one hold.
set -euo pipefail
LIBS=${FA4_LIBS:-/tmp/fa4_libs}
PARTS=/tmp/fa4_parts
if [ "${1:-}" = split ]; then
  rm -rf .devcarry/fa4_p1 .devcarry/fa4_p2 && mkdir -p .devcarry/fa4_p1 .devcarry/fa4_p2
  split -n 2 -d -a 2 .devcarry/fa4_libs/libs.tar.xz /tmp/fa4_split.
  mv /tmp/fa4_split.00 .devcarry/fa4_p1/libs.tar.xz.00-of-02
  mv /tmp/fa4_split.01 .devcarry/fa4_p2/libs.tar.xz.01-of-02
  ls -l .devcarry/fa4_p1 .devcarry/fa4_p2; exit 0
fi
ARCHIVE=.devcarry/fa4_libs/libs.tar.xz
if [ ! -f "$ARCHIVE" ]; then  # parts
  mkdir -p "$PARTS"; cp .devcarry/fa4_p*/libs.tar.xz.*-of-* "$PARTS"/ 2> /dev/null || true
  n=$(ls "$PARTS" | wc -l); want=$(ls "$PARTS" | head -1 | sed 's/.*-of-0*//')
  echo "FA-4 libs parts here: $n of ${want:-?}"
  [ -n "$want" ] && [ "$n" -ge "$want" ] || { echo "send the next part (same command) within 30 s"; exit 0; }
  cat "$PARTS"/libs.tar.xz.*-of-* > /tmp/fa4_libs.tar.xz; ARCHIVE=/tmp/fa4_libs.tar.xz
fi
T0=$(date +%s.%N)
rm -rf "$LIBS" && mkdir -p "$LIBS"
if command -v xz > /dev/null; then
  xz -dc "$ARCHIVE" | tar -xf - -C "$LIBS"
else  # no xz binary: Python's lzma
  python3 -c "import sys, tarfile; tarfile.open(sys.argv[1], 'r:xz').extractall(sys.argv[2])" "$ARCHIVE" "$LIBS"
fi
T1=$(date +%s.%N)
echo "unpacked $(du -sb "$LIBS" | cut -f1) bytes into $LIBS in $(python3 -c "print(round($T1-$T0,1))") s:"
find "$LIBS" -name '*.so' -printf '  %P %s\n'
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', \
torch.version.cuda, torch.cuda.get_device_name(), torch.cuda.get_device_capability())" || true
echo "now device call 2 (bench/gpu_fa4_run.sh) within the machine's 30 s warm period"
