#!/usr/bin/env bash
# The GPU tests, first in a GPU session (they catch what Triton's interpreter on the CPU cannot), run from the
# checkout's root on the GPU host:
#   bash scripts/gpu_tests.sh SECONDS [PYTEST_ARGS...]      (default: every test marked gpu under tests/)
# Sources scripts/device_env.sh first (the commit of .whl/head.bundle, and the carried wheels: the test modules
# import the package's planning code, which needs Snakemake), then runs `pytest -m gpu` for at most SECONDS.
set -euo pipefail
[ $# -ge 1 ] && [[ $1 =~ ^[0-9]+$ ]] || { echo "usage: $0 SECONDS [PYTEST_ARGS...]" >&2; exit 2; }
budget=$1
shift
who=gpu_tests
source "$(dirname "$0")/device_env.sh"
[ $# -gt 0 ] || set -- tests
timeout --signal=INT --kill-after=20 "$budget" python3 -m pytest -m gpu -q -p no:cacheprovider "$@"
