#!/usr/bin/env bash
# Installs the Debian packages pskv needs, skipping what is present.
# Idempotent and fast when everything is installed (one dpkg query).
# Usage: scripts/install-deps.sh [--with-torch] [--with-data] [--with-launchers] [--with-clang]
set -euo pipefail

pkgs=(cmake ninja-build g++ make pkg-config libzmq3-dev cppzmq-dev libsodium-dev libgtest-dev libgmock-dev
      libbenchmark-dev zlib1g-dev pybind11-dev python3-dev python3-numpy python3-pytest
      clang-format libcli11-dev ccache
      python3-setuptools python3-wheel python3-pip python3-venv python3-yaml python3-matplotlib
      # the RecordIO reader's JPEG/PNG decoding: C++ (optional at configure time) and Python
      libjpeg62-turbo-dev libpng-dev python3-pil)
for arg in "$@"; do
  case "$arg" in
    # OpenBLAS replaces the reference BLAS Debian's torch links (1.35x samples/s for
    # train_fmnist here); pskv-launch sets OPENBLAS_NUM_THREADS so processes sharing
    # the cores do not oversubscribe them.
    # python3-torchvision: the models of examples/image_classification.py (VGG-11, ResNet-18).
    --with-torch) pkgs+=(libtorch-dev python3-torch python3-torchvision libopenblas0-pthread) ;;
    --with-data) pkgs+=(dataset-fashion-mnist) ;;
    --with-launchers)
      # iproute2: `ip` and `tc` of the cluster tests (tests/cluster, namespaces as hosts)
      pkgs+=(openssh-server openssh-client rsync openmpi-bin slurm-wlm munge iproute2)
      # kubectl (client-side checks of the generated manifests): Debian's
      # kubernetes-client, unless a kubectl from another package is already there.
      command -v kubectl >/dev/null || pkgs+=(kubernetes-client) ;;
    --with-clang) pkgs+=(clang libclang-rt-14-dev) ;;
    *) echo "install-deps.sh: unknown option '$arg'" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${pkgs[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
echo "install-deps.sh: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
