"""How much of a RandOpt slice the base saw in pretraining: the share of each split's prompts among the
checkpoint's pretraining problems (its stream, as far as its pretraining_log.json says it read).

    python docs/experiments/<this entry>/seen_in_pretraining.py results/checkpoints/tiny-arith \\
        docs/experiments/<this entry>/narrow-3op.yaml [more slices...]

The checkpoint's own task spec and seed are the schema's defaults (the embedded default's checkpoint); a slice's
task spec is its yaml's task.synthetic_arithmetic over those defaults.
"""

import argparse
import itertools
import json
from pathlib import Path

import yaml

from workflow_src.config_schema import resolve
from workflow_src.tasks import synthetic_arithmetic as task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("slices", type=Path, nargs="+")
    args = parser.parse_args()
    seen_problems = json.loads((args.checkpoint / "pretraining_log.json").read_text())["final"]["problems_seen"]
    stream = task.pretraining_stream(resolve("task")["synthetic_arithmetic"], resolve("checkpoint")["synthetic"]["seed"])
    seen = {p.prompt for p in itertools.islice(stream, seen_problems)}
    out = {"pretraining_problems": seen_problems, "distinct_prompts": len(seen), "slices": {}}
    for path in args.slices:
        spec = resolve("task", yaml.safe_load(path.read_text())["task"])["synthetic_arithmetic"]
        splits = task.make_splits(spec)
        out["slices"][path.stem] = {name: round(sum(p.prompt in seen for p in split) / len(split), 4)
                                    for name, split in splits.items() if split}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
