"""A tiny external subject: a real torch training loop that speaks both contracts of speedproof.

    python tiny_trainer.py --impl baseline|optimized|control --steps N --out DIR [--deterministic]
        [--switches ...]

A small MLP learns a fixed teacher on seeded data, with Adam, a warm-up learning rate, gradient clipping and
gradient accumulation over micro-batches. The inputs go through an invariant preprocessing (random Fourier
features, then standardization over the whole data set) before the model sees them.

- baseline recomputes that preprocessing of the whole data set at every step;
- optimized computes it once and reuses it: the same operations on the same tensors, so it does less work and
  every bit of the training is unchanged;
- control accumulates the micro-batch gradients in the reverse order: a deliberately non-equivalent change
  (float addition is not associative), the negative control the bitwise comparison must catch.

Writes DIR/steps.jsonl (the timing contract of docs/protocol.md: one line per step, rank 0, with seconds) and,
with --deterministic, DIR/rank0.jsonl (docs/bitwise.md) through records_writer: per step the loss, the gradient
norm, the accumulated gradients (a digest) and the learning rate; finally every parameter and the Adam state.
--switches are accepted and recorded.
"""

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import torch

# Imported from its own file, as a repository that copied records_writer.py next to its trainer would.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "workflow_src" / "bitwise"))
from records_writer import RecordWriter, tensor_digest  # noqa: E402

SETTINGS = {"seed": 0, "samples": 4096, "inputs": 16, "features": 512, "hidden": 64, "batch": 64,
            "micro_batches": 4, "lr": 3e-3, "warmup_steps": 2, "max_grad_norm": 1.0}


def make_data(s: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(s["seed"])
    x = torch.randn(s["samples"], s["inputs"], generator=g)
    projection = torch.randn(s["inputs"], s["features"], generator=g)
    phase = torch.rand(s["features"], generator=g) * 6.283185307179586
    teacher = torch.randn(s["inputs"], 1, generator=g)
    y = torch.tanh(x @ teacher) + 0.1 * torch.randn(s["samples"], 1, generator=g)
    return x, y, projection, phase


def preprocess(x: torch.Tensor, projection: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
    """Random Fourier features of the whole data set, standardized per feature: the invariant part."""
    f = torch.cos(x @ projection + phase)
    return (f - f.mean(dim=0)) / f.std(dim=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impl", choices=["baseline", "optimized", "control"], required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--switches", nargs="*", default=[])
    a = ap.parse_args()
    if a.steps < 1:
        raise SystemExit("tiny_trainer: --steps must be >= 1")

    s = SETTINGS
    # One thread: the bits then do not depend on how many cores the host lends the job.
    torch.set_num_threads(1)
    if a.deterministic:
        torch.use_deterministic_algorithms(True)
    x, y, projection, phase = make_data(s)
    torch.manual_seed(s["seed"])
    model = torch.nn.Sequential(torch.nn.Linear(s["features"], s["hidden"]), torch.nn.Tanh(),
                                torch.nn.Linear(s["hidden"], 1))
    opt = torch.optim.Adam(model.parameters(), lr=s["lr"])
    identity = {"settings_sha256": hashlib.sha256(json.dumps(s, sort_keys=True).encode()).hexdigest(),
                "data_sha256": tensor_digest(torch.cat([x.flatten(), y.flatten(), projection.flatten(), phase])),
                "init_sha256": tensor_digest(torch.cat([p.detach().flatten() for p in model.parameters()]))}
    records = (RecordWriter(a.out, impl=a.impl, identity=identity, steps=a.steps, switches=a.switches)
               if a.deterministic else None)
    cached = preprocess(x, projection, phase) if a.impl != "baseline" else None
    micro = s["batch"] // s["micro_batches"]

    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / "steps.jsonl", "w", encoding="utf-8") as log:
        for step in range(a.steps):
            t0 = time.perf_counter()
            features = preprocess(x, projection, phase) if cached is None else cached
            t1 = time.perf_counter()
            batch = torch.randperm(s["samples"], generator=torch.Generator().manual_seed(1000 + step))[:s["batch"]]
            parts = [batch[k * micro:(k + 1) * micro] for k in range(s["micro_batches"])]
            if a.impl == "control":
                parts.reverse()
            lr = s["lr"] * min(1.0, (step + 1) / s["warmup_steps"])
            for group in opt.param_groups:
                group["lr"] = lr
            loss_sum = torch.zeros(())
            for idx in parts:
                loss = torch.nn.functional.mse_loss(model(features[idx]), y[idx]) / s["micro_batches"]
                loss.backward()  # .grad accumulates the micro-batches in the order of `parts`
                loss_sum = loss_sum + loss.detach()
            grads = torch.cat([p.grad.flatten() for p in model.parameters()])
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), s["max_grad_norm"])
            opt.step()
            opt.zero_grad(set_to_none=True)
            t2 = time.perf_counter()
            if records is not None:
                records.step(step, loss=loss_sum, grad_norm=grad_norm, grads=grads, lr=lr)
            log.write(json.dumps({"step": step, "rank": 0, "seconds": t2 - t0,
                                  "phases": {"preprocess": t1 - t0, "train": t2 - t1}}) + "\n")
            log.flush()
    if records is not None:
        records.final(params=model.named_parameters(), optimizer=opt)
        records.close()
    print(f"tiny_trainer {a.impl}: {a.steps} steps, last loss {loss_sum.item():.6f}", file=sys.stderr)


if __name__ == "__main__":
    main()
