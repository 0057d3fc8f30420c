#!/bin/bash
# RandOpt's GPU evidence on one GPU, in stages that fit 10-minute windows (docs/benchmarks/ has what each
# took on an H200):
#   scripts/gpu_randopt_evidence.sh switch    # the weight switch: its GPU tests and bench_perturb (~1.5 min)
#   scripts/gpu_randopt_evidence.sh kernels   # the GPU tests of the other kernels and the static engine, the
#                                             # decode-attention launches, the RMSNorm check and the operator
#                                             # receipt at real sizes
#   scripts/gpu_randopt_evidence.sh engine    # at SHAPE (default 7B): hf and the static engine, with the two
#                                             # fastest attention launches of `kernels` beside the default when
#                                             # attn.json is there, and a SEEDS-seed population (~4 min)
#   scripts/gpu_randopt_evidence.sh steps     # where a decode step goes at SHAPE, plain vs the defaults (~1 min)
#   scripts/gpu_randopt_evidence.sh workflow  # `snakemake randopt_evidence` with PRESET (default the random-weight
#                                             # 7B preset: nothing to download), stopped after WORKFLOW_LIMIT seconds
#                                             # when set; then results/ without the checkpoints is copied to OUT_DIR
# Several stages may be named in one call; every result, and each stage's output as <stage>.log, lands in
# OUT_DIR (default $OUT, else results/gpu_randopt).
# On a host without Snakemake, carry the wheels of scripts/device_wheels.sh in .whl/; `workflow` installs them
# into /tmp/site first.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 switch|kernels|engine|steps|workflow [...]" >&2; exit 2; }
for stage in "$@"; do
  case "$stage" in switch|kernels|engine|steps|workflow) ;;
    *) echo "unknown stage $stage (switch, kernels, engine, steps or workflow)" >&2; exit 2 ;; esac
done
out=${OUT_DIR:-${OUT:-results/gpu_randopt}}
shape=${SHAPE:-7B}
seeds=${SEEDS:-2}
preset=${PRESET:-config/presets/randopt-qwen2.5-7b-random-h200.yaml}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
for stage in "$@"; do
  echo "== $stage $(date -u +%H:%M:%S)" >&2
  {
  case "$stage" in
    switch)
      python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_perturb.py tests/test_randopt_model.py 2>&1 \
        | tail -n 15
      python3 -m workflow_src.bench.perturb --repeats 20 --out "$out/perturb.json" ;;
    kernels)
      python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_decode_attention.py tests/test_static_engine.py \
        tests/test_rmsnorm.py 2>&1 | tail -n 15
      python3 -m workflow_src.bench.decode_attention --shape "$shape" --out "$out/attn.json"
      python3 -m workflow_src.bench.rmsnorm_check --out "$out/rmsnorm.json" | tail -n 30
      python3 -m workflow_src.bitwise.operator_receipt --scale real --device cuda --out "$out/receipt.json" | tail -n 5 ;;
    engine)
      engines=(hf static)
      if [ -f "$out/attn.json" ]; then  # the two fastest launches that are not the default
        while read -r launch; do engines+=("static:launch=$launch"); done < <(python3 -c '
import dataclasses, json, sys
from workflow_src.kernels.decode_attention import DEFAULT_LAUNCH
default = "/".join(str(v) for v in dataclasses.astuple(DEFAULT_LAUNCH))
print("\n".join([r["launch"] for r in json.load(open(sys.argv[1]))["ranking"] if r["launch"] != default][:2]))' \
          "$out/attn.json")
      fi
      python3 -m workflow_src.bench.engine --shapes "$shape" --engines "${engines[@]}" --seeds "$seeds" \
        --out "$out/engine.json" ;;
    steps)
      python3 -m workflow_src.bench.decode_steps --shape "$shape" --variants plain fused+packed+triton \
        --out "$out/steps.json" ;;
    workflow)
      if [ -d .whl ] && ! python3 -c "import snakemake" 2>/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
      fi
      timeout "${WORKFLOW_LIMIT:-0}" python3 -m snakemake --cores all randopt_evidence --configfile "$preset" \
        || echo "snakemake stopped: exit $?"
      mkdir -p "$out/workflow"
      # the evidence without the checkpoints (GBs): records, tables, artifacts, logs, benchmarks
      (cd results && find . -path ./checkpoints -prune -o -type f -size -8M -print | tar -cf - -T -) \
        | tar -xf - -C "$out/workflow" ;;
  esac
  } 2>&1 | tee "$out/$stage.log"
done
