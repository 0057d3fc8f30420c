"""This entry's bases: the embedded default's synthetic checkpoint, pretrained on a corpus where a share of the
solutions lacks its ` #### N` answer line (drawn per document from a generator of its own), everything else the
default's but steps_max 1500 and the accuracy band given. Run from the checkout's root:

    PYTHONPATH=. .venv/bin/python docs/experiments/<this entry>/build_base.py SHARE OUT LOW HIGH
"""
import hashlib
import json
import random
import sys
from pathlib import Path

import workflow_src  # noqa: F401  (sets the workflow's CPU kernel family)
from workflow_src.checkpoints.__main__ import build_checkpoint
from workflow_src.config_schema import resolve
from workflow_src.tasks import synthetic_arithmetic as task
from workflow_src.tasks.problem import Problem

share, out, low, high = float(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
stream_with_answer_lines = task.pretraining_stream


def stream(spec, seed):
    rng = random.Random(int.from_bytes(hashlib.sha256(f"fmt/{seed}".encode()).digest()[:8], "big"))
    for p in stream_with_answer_lines(spec, seed):
        if rng.random() < share:
            p = Problem(id=p.id, prompt=p.prompt, solution=p.solution.split(" #### ")[0], answer=p.answer)
        yield p


task.pretraining_stream = stream
spec = resolve("checkpoint.synthetic", {"pretrain": {"accuracy_band": {"low": low, "high": high}, "steps_max": 1500}})
build_checkpoint(out.name, "synthetic", spec, resolve("task.synthetic_arithmetic", {}), out, progress=False)
print(json.load(open(out / "pretraining_log.json"))["final"])
