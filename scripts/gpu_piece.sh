#!/usr/bin/env bash
# One piece of a workflow target on a GPU host lent in calls of a few minutes (docs/rl-subject.md, "Evidence over
# several device windows"), run from the checkout's root:
#   [RESTORE=FILE] bash scripts/gpu_piece.sh SECONDS OUTDIR -- SNAKEMAKE_ARGS...
# Unpacks RESTORE (the last piece's results.tar.gz, carried under a git-ignored path such as .whl/) when given;
# sources scripts/device_env.sh (the commit of .whl/head.bundle; says so when the checkout is not clean, when every
# record says dirty and `make keep` refuses it: the device's copy of a checkout does not take its
# .git/info/exclude, so carry files under a .gitignore'd path; the carried wheels where Snakemake is missing);
# rebuilds every checkpoint whose MANIFEST.json came carried under results/checkpoints (weights are too large to
# carry) and checks that its manifest equals the carried one, dated back so Snakemake does not take the rebuild for
# changed input; runs Snakemake for at most SECONDS; then packs results/ and .snakemake/ (checkpoint weights left
# out) into OUTDIR/results.tar.gz for the next piece.
set -euo pipefail
[ $# -ge 3 ] && [ "$3" = "--" ] || { echo "usage: $0 SECONDS OUTDIR -- SNAKEMAKE_ARGS..." >&2; exit 2; }
budget=$1 out=$2
shift 3
configs=()
for ((i = 1; i <= $#; i++)); do  # the run's --configfile files, for the checkpoint rebuilds
  if [ "${!i}" = "--configfile" ]; then
    for ((j = i + 1; j <= $#; j++)); do
      case "${!j}" in -*) break ;; *) configs+=("${!j}") ;; esac
    done
  fi
done
if [ -n "${RESTORE:-}" ]; then
  tar xzf "$RESTORE" || { echo "gpu_piece: cannot unpack RESTORE=$RESTORE" >&2; exit 2; }
  echo "gpu_piece: unpacked $RESTORE"
fi
who=gpu_piece
source "$(dirname "$0")/device_env.sh"
start=$(date +%s)
for manifest in results/checkpoints/*/MANIFEST.json; do
  [ -f "$manifest" ] || continue
  ckpt=$(dirname "$manifest")
  cp "$manifest" /tmp/carried-manifest.json
  rm -rf "$ckpt"
  with=()
  [ ${#configs[@]} -eq 0 ] || with=(--configfile "${configs[@]}")
  python3 -m snakemake --cores all "$ckpt" "${with[@]}" > /tmp/checkpoint-rebuild.log 2>&1 \
    || { tail -20 /tmp/checkpoint-rebuild.log; exit 1; }
  cmp -s "$manifest" /tmp/carried-manifest.json \
    || { echo "gpu_piece: $ckpt rebuilt with other bytes than the carried manifest names" >&2; exit 1; }
  find "$ckpt" -exec touch -h -d 2000-01-01 {} +
done
left=$((budget - ($(date +%s) - start)))
rc=0
timeout --signal=INT --kill-after=20 "$left" python3 -m snakemake --cores all "$@" || rc=$?
python3 -m snakemake --unlock "$@" > /dev/null 2>&1 || true
mkdir -p "$out"
tar czf "$out/results.tar.gz" --exclude='results/checkpoints/*/*.safetensors' results .snakemake
echo "gpu_piece: snakemake exit $rc after $(($(date +%s) - start)) s; $(du -h "$out/results.tar.gz" | cut -f1) packed"
exit $rc
