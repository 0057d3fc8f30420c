#!/bin/bash
# The RL subject's evidence on one GPU with a GPU preset, in stages that fit 10-minute windows:
#   scripts/gpu_rl_evidence.sh check   # switch_check (~3 min): the baseline, each switch alone, all, the control;
#                                      # with CANDIDATES=a,b: the preset's switches, plus each candidate, plus all,
#                                      # and $OUT_DIR/switches.json, the largest set that kept the bits
#   scripts/gpu_rl_evidence.sh bitwise # the 14-step comparisons of the optimized run and the control, with
#                                      # switches.json when it exists; the deterministic runs share the GPU (~3 min)
#   scripts/gpu_rl_evidence.sh paired  # the paired launches A -> opt -> B (one at a time) and the table (~6 min)
#   scripts/gpu_rl_evidence.sh launch-A # paired's first launch alone: `launch-A` at the end of one call and
#                                      # `paired` at the start of the next split it where one 10-minute window
#                                      # does not hold all three launches (2 ranks: A ~3.5 min, B ~4 min)
# Several stages may be named in one call (`check bitwise`). Stages share results/ and $OUT_DIR: run them on
# one machine, in this order. Environment: PRESET (default the 0.5B H200 preset), OUT_DIR (default
# results/gpu_evidence), CANDIDATES (switches to try on top of the preset's), NPROC (ranks per launch, one
# GPU each, FSDP2 over NCCL: the preset runs as experiment <name>-nproc<N>; default the preset's rl.nproc).
# `check` runs one rank whatever NPROC says. On a host without Snakemake,
# carry the wheels of scripts/device_wheels.sh in .whl/; they are installed into /tmp/site first.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 check|bitwise|paired|launch-A [...]" >&2; exit 2; }
for stage in "$@"; do
  case "$stage" in check|bitwise|paired|launch-A) ;;
    *) echo "unknown stage $stage (check, bitwise, paired or launch-A)" >&2; exit 2 ;; esac
done
preset=${PRESET:-config/presets/rl-qwen2.5-0.5b-h200.yaml}
out=${OUT_DIR:-results/gpu_evidence}
candidates=${CANDIDATES:-}
nproc=${NPROC:-}
mkdir -p "$out"
if [ -d .whl ] && ! python3 -c "import snakemake" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
fi
export PYTHONUNBUFFERED=1
exp=$(python3 -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['experiment'])" "$preset")
model=$(python3 -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['checkpoint']['name'])" "$preset")
if [ -n "$nproc" ]; then
  exp="$exp-nproc$nproc"
  printf '{"experiment": "%s", "rl": {"nproc": %d}}\n' "$exp" "$nproc" > "$out/nproc.json"
else
  rm -f "$out/nproc.json"
fi
smk() {
  local files=("$preset")
  [ -f "$out/switches.json" ] && files+=("$out/switches.json")
  [ -f "$out/nproc.json" ] && files+=("$out/nproc.json")
  python3 -m snakemake --cores all "$@" --configfile "${files[@]}"
}
for stage in "$@"; do
  echo "== $stage $(date -u +%H:%M:%S)" >&2
  case "$stage" in
    check)
      rm -f "$out/switches.json"
      smk results/config/rl.json results/config/task.synthetic_arithmetic.json "results/checkpoints/$model"
      python3 -m workflow_src.subjects.rl.switch_check --checkpoint "results/checkpoints/$model" \
        --rl-section results/config/rl.json --task-section results/config/task.synthetic_arithmetic.json \
        --steps 2 ${candidates:+--candidates "$candidates" --overlay "$out/switches.json"} \
        --out "$out/switch_check.json" ;;
    bitwise)
      # Bits do not depend on what else runs on the GPU, so the deterministic runs go side by side
      # (4 torch threads per rank; with NPROC every run's rank r shares GPU r with the other runs' rank r);
      # the timed launches of `paired` keep the whole machine.
      smk "results/bitwise/$exp/compare/optimized.json" "results/bitwise/$exp/compare/control.json" \
        --resources gpu=4 --set-threads deterministic_run=4
      cp "results/bitwise/$exp/compare/optimized.json" "$out/bitwise_optimized.json"
      cp "results/bitwise/$exp/compare/control.json" "$out/bitwise_control.json" ;;
    launch-A)
      smk results/speedup/training_code_alone/A ;;
    paired)
      smk results/speedup/training_code_alone/speedup.json results/speedup/training_code_alone/windows.csv
      cp results/speedup/training_code_alone/speedup.json results/speedup/training_code_alone/windows.csv "$out/"
      for launch in A opt B; do
        cp "results/speedup/training_code_alone/$launch/steps.jsonl" "$out/steps_$launch.jsonl" 2>/dev/null || true
      done ;;
  esac
done
echo "== done $(date -u +%H:%M:%S)" >&2
