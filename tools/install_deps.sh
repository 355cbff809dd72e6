#!/usr/bin/env bash
# Installs what momfmm needs from Debian's packages (run as root, or with sudo
# available). Packages already present are left as they are.
set -euo pipefail
packages=(
  build-essential cmake pkg-config
  libopenmpi-dev openmpi-bin
  libopenblas-dev
  libhdf5-dev libhdf5-openmpi-dev hdf5-tools libdnnl-dev
  python3-torch python3-h5py python3-numpy python3-matplotlib python3-pytest
  python3-scipy python3-setuptools python3-venv python3-sentencepiece
  slurmctld slurmd slurm-client munge
  iproute2
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install_deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
