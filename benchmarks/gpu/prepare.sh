#!/usr/bin/env bash
# What the GPU machine needs and lacks, made here where it costs no device time: the wheels (wheelhouse.sh),
# under .gpu/ (git-ignored), which run.sh reads there. (The built-in models ship in the package.)
set -euo pipefail
cd "$(dirname "$0")/../.."
bash benchmarks/gpu/wheelhouse.sh .gpu/wheels
echo "prepare: .gpu in all: $(du -sh .gpu | cut -f1)"
