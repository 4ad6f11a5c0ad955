#!/usr/bin/env bash
# What the GPU machine needs and lacks, made here where it costs no device time: the wheels (wheelhouse.sh) and
# the built-in tiny coder's warm-started checkpoint, both under .gpu/ (git-ignored), which run.sh reads there.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash benchmarks/gpu/wheelhouse.sh .gpu/wheels
model=$(python -c "from areal.models.loading import checkpoint_dir; print(checkpoint_dir('builtin:tiny-coder'))")
rm -rf .gpu/tiny-coder && cp -r "$model" .gpu/tiny-coder
echo "prepare: .gpu/tiny-coder from $model ($(du -sh .gpu/tiny-coder | cut -f1)); .gpu in all: $(du -sh .gpu | cut -f1)"
