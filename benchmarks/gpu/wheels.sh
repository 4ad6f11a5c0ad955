# Sourced by the device scripts: install .gpu/wheels (made here by prepare.sh) where the GPU machine's python finds
# them, and put the repository on its path.
if compgen -G ".gpu/wheels/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/areal-site \
    .gpu/wheels/*.whl || { echo "installing .gpu/wheels failed" >&2; exit 1; }
  export PYTHONPATH=/tmp/areal-site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 AREAL_CACHE=/tmp/areal-cache
