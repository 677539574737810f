#!/usr/bin/env bash
# On a rented GPU box (CUDA driver present): the same two commands as on a laptop.
# The pinned torch==2.13.0 from PyPI is a CUDA build on Linux x86_64, so GPUs are used.
set -euo pipefail
cd "$(dirname "$0")/.."
sudo apt-get install -y libaio-dev || true   # NVMe offload (optional)
make setup
.venv/bin/python -m gpumem check-env
make gpu-check
