#!/usr/bin/env bash
# Builds device-carry/ (git-ignored): the wheels scripts/gpu_runs.sh installs on the GPU machine,
# which has torch 2.11, Python 3.12, transformers and accelerate but no internet and no DeepSpeed.
#   DeepSpeed 0.19.8, built here as a pure-Python wheel (DS_BUILD_OPS=0: its ops, CPU Adam among
#   them, are compiled just in time there, where nvcc and ninja are), and what it needs that the
#   machine's image lacks: hjson, pydantic (+ pydantic-core for cp312, annotated-types,
#   typing-inspection) and the typing-extensions pydantic 2.14 asks for.
# Usage: scripts/build_device_carry.sh [PIP]   (PIP: a pip whose environment has torch, to build with)
# Then name device-carry in the device call's carry list (about 5 MB).
set -euo pipefail
pip=${1:-.venv/bin/pip}
dir=device-carry
mkdir -p "$dir"
DS_BUILD_OPS=0 "$pip" wheel --no-build-isolation --no-deps -q deepspeed==0.19.8 -w "$dir"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$dir" hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
    typing-inspection==0.4.5 typing-extensions==4.16.0
ls -la "$dir"
du -sh "$dir"
