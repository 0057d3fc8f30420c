#!/bin/bash
# The RL subject's evidence on one GPU with the H200 preset, in stages that each fit a 10-minute window
# (a baseline step takes ~8 s there; docs/benchmarks/2026-11-29-h200-rl-qwen2.5-0.5b.md):
#   scripts/gpu_rl_evidence.sh check   [OUT]  # switch_check at the preset's shapes (~3 min): which switches keep the bits
#   scripts/gpu_rl_evidence.sh bitwise [OUT]  # the 14-step comparisons of the optimized run and the control (~6 min)
#   scripts/gpu_rl_evidence.sh paired  [OUT]  # the paired launches A -> opt -> B and the table (~6 min; reuses bitwise)
# Stages share results/ (run them on one machine, in this order). On a host without Snakemake, carry the
# wheels of scripts/device_wheels.sh in .whl/; they are installed into /tmp/site first.
set -euo pipefail
stage=${1:?check, bitwise or paired}
case "$stage" in check|bitwise|paired) ;; *) echo "unknown stage $stage (check, bitwise or paired)" >&2; exit 2 ;; esac
out=${2:-results/gpu_evidence}
mkdir -p "$out"
if [ -d .whl ] && ! python3 -c "import snakemake" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
fi
export PYTHONUNBUFFERED=1
preset=config/presets/rl-qwen2.5-0.5b-h200.yaml
exp=rl-qwen2_5-0_5b-h200
smk() { python3 -m snakemake --cores all "$@" --configfile "$preset"; }
case "$stage" in
  check)
    smk results/config/rl.json results/config/task.synthetic_arithmetic.json results/checkpoints/qwen2.5-0.5b-random
    python3 -m workflow_src.rl.switch_check --checkpoint results/checkpoints/qwen2.5-0.5b-random \
      --rl-section results/config/rl.json --task-section results/config/task.synthetic_arithmetic.json \
      --steps 2 --out "$out/switch_check.json" ;;
  bitwise)
    smk "results/bitwise/$exp/compare/optimized.json" "results/bitwise/$exp/compare/control.json"
    cp "results/bitwise/$exp/compare/optimized.json" "$out/bitwise_optimized.json"
    cp "results/bitwise/$exp/compare/control.json" "$out/bitwise_control.json" ;;
  paired)
    smk results/speedup/training_code_alone/speedup.json results/speedup/training_code_alone/windows.csv
    cp results/speedup/training_code_alone/speedup.json results/speedup/training_code_alone/windows.csv "$out/" ;;
esac
