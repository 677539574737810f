#!/usr/bin/env bash
# A rented GPU box in one command: on a fresh Linux machine with an NVIDIA driver,
#
#   git clone <course> && cd <course> && bash env/gpu_box_setup.sh [--gpu-check]
#
# creates .venv with a CUDA build of the pinned torch (the wheel index matching the driver),
# installs the pinned requirements and DeepSpeed with its ops compiled at install time for this
# GPU (cpu_adam, fused_adam, utils, and async_io when libaio is present), installs gpumem,
# runs `python -m gpumem check-env`, and prints what to open. --gpu-check then runs
# `make gpu-check`, which writes results/gpu/<date>_<gpu>.json (commit it).
#
# Variables: PYTHON (default python3.11, else python3), TORCH_CUDA (wheel tag, e.g. cu128; default
# from the driver), SKIP_APT=1 (no apt-get), PORT (JupyterLab, default 8888).
set -euo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
say() { printf '\n== %s (%ds)\n' "$*" $((SECONDS - START)); }
die() { printf 'gpu_box_setup: %s\n' "$*" >&2; exit 1; }

GPU_CHECK=0
for arg in "$@"; do
  case "$arg" in
    --gpu-check) GPU_CHECK=1 ;;
    *) die "unknown option $arg (accepted: --gpu-check)" ;;
  esac
done

# -- the driver, the GPU, the wheel it can run -----------------------------------------------
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this script is for a machine with an NVIDIA driver (use 'make lab' elsewhere)"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0)
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader -i 0)          # e.g. 9.0
DRIVER_CUDA=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9]*\.[0-9]*\).*/\1/p' | head -n 1)
say "GPU: $GPU (compute capability $CAP), driver supports CUDA up to $DRIVER_CUDA"
if [[ -z "${TORCH_CUDA:-}" ]]; then
  major=${DRIVER_CUDA%%.*}; minor=${DRIVER_CUDA##*.}
  if   (( major >= 13 ));                     then TORCH_CUDA=cu130
  elif (( major == 12 && minor >= 8 ));       then TORCH_CUDA=cu128
  elif (( major == 12 && minor >= 6 ));       then TORCH_CUDA=cu126
  else die "the driver supports CUDA $DRIVER_CUDA; torch's CUDA wheels need 12.6 or later: update the driver or set TORCH_CUDA"
  fi
fi
TORCH_PIN=$(grep -E '^torch==' env/requirements.txt | cut -d'#' -f1 | tr -d ' ')
DS_PIN=$(grep -E '^deepspeed==' env/requirements.txt | cut -d'#' -f1 | tr -d ' ')

# -- system packages (headers for NVMe offload, a compiler for DeepSpeed's ops) -----------------
if [[ "${SKIP_APT:-0}" != 1 ]] && command -v apt-get >/dev/null; then
  SUDO=$([[ $(id -u) == 0 ]] && echo "" || echo sudo)
  say "apt-get: libaio-dev, build tools, python3-venv"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq libaio-dev build-essential python3-venv python3-dev >/dev/null \
    || echo "apt-get failed: continuing (NVMe offload needs libaio-dev)"
fi

# -- the environment ---------------------------------------------------------------------------
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
"$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is needed, found " + sys.version.split()[0]'
say "creating .venv with $PYTHON; $TORCH_PIN from the $TORCH_CUDA wheel index"
"$PYTHON" -m venv .venv
PY=.venv/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1
$PY -m pip install -q --upgrade pip
$PY -m pip install -q "$TORCH_PIN" --index-url "https://download.pytorch.org/whl/$TORCH_CUDA"
$PY -c 'import torch; assert torch.version.cuda, "a CPU build of torch was installed"; print("torch", torch.__version__, "CUDA", torch.version.cuda)'
say "the pinned requirements (torch stays the CUDA build: its version matches the pin)"
$PY -m pip install -q -r env/requirements.txt

say "$DS_PIN with its ops compiled for compute capability $CAP (several minutes)"
AIO=0; [[ -e /usr/include/libaio.h ]] && AIO=1
TORCH_CUDA_ARCH_LIST="$CAP" DS_BUILD_CPU_ADAM=1 DS_BUILD_FUSED_ADAM=1 DS_BUILD_UTILS=1 DS_BUILD_AIO=$AIO \
  $PY -m pip install -q --no-cache-dir --no-build-isolation --force-reinstall --no-deps "$DS_PIN"
$PY -m pip install -q --no-deps -e .
touch .venv/.installed        # the Makefile's stamp: `make` reuses this environment as it is

# -- check and say what to open ----------------------------------------------------------------
say "make setup (DeepSpeed's CPU ops into .cache/torch_extensions) and check-env"
make --no-print-directory setup
$PY -m gpumem check-env
.venv/bin/ds_report 2>/dev/null | grep -E "cpu_adam|fused_adam|async_io" || true
if (( GPU_CHECK )); then
  say "make gpu-check"
  make --no-print-directory gpu-check
fi

PORT=${PORT:-8888}
cat <<EOF

== ready in $((SECONDS - START)) s on $GPU
Open the course:
  make lab LAB_ARGS="--no-browser --port $PORT"          # on the box
  ssh -N -L $PORT:localhost:$PORT <you>@<this box>         # on your laptop, then open the URL it printed
  start with notebooks/00_setup.ipynb; every chapter's GPU cells run here.
Measure the GPU items and commit what they measured:
  make gpu-check            # writes results/gpu/<date>_<gpu>.json and .md
Several GPUs or nodes: env/launch_examples.md, env/hostfile.example, env/slurm_example.sbatch
EOF
