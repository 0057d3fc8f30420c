#!/usr/bin/env bash
# Before a session's first device call: writes .whl/head.bundle, this checkout's HEAD as a git bundle (all its
# history, about 3 MB), for scripts/gpu_piece.sh to take on the GPU host. The host's copy of the working tree is
# this checkout's, but its .git can be an older commit's (the device tool keeps the .git of an earlier call), so
# every record made there would name that commit and say dirty; with the bundle carried (.whl/ is git-ignored and
# carried for the wheels), the piece moves the host's HEAD and index to this commit first, leaving the files as
# they came. Refuses a checkout that is not clean: records copied into docs/evidence/ come from a clean commit.
#   bash scripts/device_head.sh
set -euo pipefail
cd "$(dirname "$0")/.."
changed=$(git status --porcelain | head -5 | tr '\n' ' ')
[ -z "$changed" ] || { echo "device_head: the checkout is not clean ($changed); commit first" >&2; exit 2; }
mkdir -p .whl
git bundle create -q .whl/head.bundle HEAD
echo "device_head: .whl/head.bundle holds $(git rev-parse HEAD)"
