"""Write the bitwise comparison's record files (docs/bitwise.md) from any training loop.

One file, standard library only at import time, so another repository can import it from a speedproof
checkout or copy it next to its own trainer. torch is only touched when a tensor is passed (it is then already
imported by the caller). The encodings here are the ones the workflow itself uses (`bitwise/digest.py`
re-exports them), so a vendored copy records the same bits as the built-in subject.

    from records_writer import RecordWriter

    with RecordWriter(out_dir, impl="fast", identity={"seed": 0, "data": data_sha256}, steps=n) as records:
        for step in range(n):
            loss, grad_norm = train_step(step)
            records.step(step, loss=loss, grad_norm=grad_norm, lr=scheduler.get_last_lr()[0])
        records.final(params=model.named_parameters(), optimizer=optimizer)

writes ``out_dir/rank{r}.jsonl`` atomically when the block ends; if the block raises, nothing is written. The
rank and world size are the ones given, else torch.distributed's where the caller initialized a process group
(torch.multiprocessing.spawn sets no environment), else $RANK and $WORLD_SIZE as torchrun sets them, else 0 and 1.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

if sys.byteorder != "little":  # raw tensor bytes are hashed as they lie in memory
    raise ImportError("speedproof digests assume a little-endian host")

FORMAT_DOC = "docs/bitwise.md"
_HEX = re.compile(r"[0-9a-f]+")
# Integers above this are not exactly representable as a float64, so their scalar hex would lose bits.
_EXACT_INT = 2 ** 53


class RecordError(ValueError):
    """A record that the comparison would refuse or that could hide a difference; the message says which."""


def _torch_tensor_type():
    """torch.Tensor if torch is loaded; a value cannot be a tensor otherwise, so torch is never imported here."""
    torch = sys.modules.get("torch")
    return None if torch is None else torch.Tensor


def _is_tensor(x: Any) -> bool:
    tensor = _torch_tensor_type()
    return tensor is not None and isinstance(x, tensor)


def tensor_digest(t) -> str:
    """sha256 over the dtype name, the shape and the raw little-endian bytes of the contiguous tensor."""
    import torch
    t = t.detach()
    if hasattr(t, "full_tensor"):  # a DTensor (FSDP2 shard): digest the whole tensor
        t = t.full_tensor()
    t = t.cpu().contiguous()
    h = hashlib.sha256()
    h.update(str(t.dtype).removeprefix("torch.").encode())
    h.update(repr(tuple(t.shape)).encode())
    if t.numel():
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def scalar_hex(x) -> str:
    """The IEEE-754 bits, most significant byte first: float32 tensors as 8 hex digits, bf16/fp16 tensors as
    4; Python floats and float64 tensors as 16."""
    if _is_tensor(x):
        import torch
        x = x.detach()
        if hasattr(x, "full_tensor"):
            x = x.full_tensor()
        if x.dtype == torch.float32:
            return struct.pack("<f", x.item())[::-1].hex()
        if x.dtype in (torch.bfloat16, torch.float16):
            return x.cpu().reshape(1).view(torch.int16).item().to_bytes(2, "little", signed=True)[::-1].hex()
        x = float(x.item())
    return struct.pack("<d", float(x))[::-1].hex()


def encode_value(value: Any, name: str = "item") -> str | list[str]:
    """One item's recorded form: a lowercase hex string, or a list of them.

    Tensors of one or more dimensions (and 0-dim non-float tensors) become their digest; 0-dim float tensors,
    Python floats and exactly representable ints their IEEE hex; a list or tuple is encoded element by
    element; a string must already be lowercase hex (a digest or IEEE bits taken elsewhere)."""
    if isinstance(value, (list, tuple)):
        return [_encode_one(v, f"{name}[{k}]") for k, v in enumerate(value)]
    return _encode_one(value, name)


def _encode_one(value: Any, name: str) -> str:
    if isinstance(value, str):
        if not _HEX.fullmatch(value):
            raise RecordError(f"{name}: {value!r:.40} is not lowercase hex; pass the value itself (a tensor or "
                              f"a float) or an encoding from tensor_digest/scalar_hex ({FORMAT_DOC})")
        return value
    if _is_tensor(value):
        return scalar_hex(value) if value.dim() == 0 and value.is_floating_point() else tensor_digest(value)
    if isinstance(value, bool):
        raise RecordError(f"{name}: a bool is not a recorded number; record it as a float or a tensor")
    if isinstance(value, float):
        return scalar_hex(value)
    if isinstance(value, int):
        if abs(value) > _EXACT_INT:
            raise RecordError(f"{name}: the int {value} has no exact float64 form; record it as an int64 tensor")
        return scalar_hex(float(value))
    raise RecordError(f"{name}: cannot record a {type(value).__name__}; pass a torch tensor, a float, a list "
                      "of floats or a lowercase hex string")


def _env_int(variable: str, default: int) -> int:
    raw = os.environ.get(variable)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise RecordError(f"${variable} is {raw!r}, not an integer") from None


def _write_atomically(path: Path, text: str) -> None:
    """Temporary sibling, fsync, rename: a killed writer leaves no half file that looks finished."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; records are ordinary files
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _process_group() -> tuple[int, int] | None:
    """(rank, world) of torch.distributed's default process group where the caller has initialized one, without
    importing torch (this file needs the standard library alone): launchers such as torch.multiprocessing.spawn
    set no RANK / WORLD_SIZE, and every rank would otherwise write rank0.jsonl."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist.get_rank(), dist.get_world_size()


class RecordWriter:
    """The record file of one rank of one deterministic run: a meta line, steps 0..steps-1 in order, a final
    line. Lines are kept in memory and written, atomically, by close() (or the end of a ``with`` block).

    identity: everything that decides the numbers apart from the implementation and its switches (seed,
    config and data hashes, ...); the comparison refuses runs whose identities differ."""

    def __init__(self, out_dir: str | os.PathLike, *, impl: str, identity: Mapping[str, Any], steps: int,
                 rank: int | None = None, world: int | None = None, switches: Iterable[str] = ()):
        if rank is None or world is None:  # what the caller did not give: the process group's, else torchrun's
            environment = (_env_int("RANK", 0), _env_int("WORLD_SIZE", 1))
            group = _process_group()
            if group is not None and rank is None and world is None and "RANK" in os.environ and environment != group:
                raise RecordError(f"RANK/WORLD_SIZE say rank {environment[0]} of {environment[1]}, "
                                  f"torch.distributed says rank {group[0]} of {group[1]}: pass rank= and world=")
            default_rank, default_world = group or environment
            rank = default_rank if rank is None else rank
            world = default_world if world is None else world
        if not isinstance(impl, str) or not impl:
            raise RecordError(f"impl must be a non-empty string, got {impl!r}")
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise RecordError(f"steps must be an integer >= 1, got {steps!r}")
        if not isinstance(world, int) or world < 1:
            raise RecordError(f"world must be an integer >= 1, got {world!r}")
        if not isinstance(rank, int) or not 0 <= rank < world:
            raise RecordError(f"rank {rank!r} is outside world size {world} (ranks 0..{world - 1})")
        if not isinstance(identity, Mapping) or not identity:
            raise RecordError("identity must be a non-empty mapping (what decides the numbers: seed, config "
                              "and data hashes, ...): runs compare only when it agrees")
        if isinstance(switches, str):  # list("ab") would record the switches a and b
            raise RecordError(f"switches must be an iterable of strings, got the string {switches!r}")
        switches = list(switches)
        if not all(isinstance(s, str) for s in switches):
            raise RecordError(f"switches must be strings, got {switches!r}")
        self.path = Path(out_dir) / f"rank{rank}.jsonl"
        self.rank, self.world, self.steps = rank, world, steps
        self._lines: list[dict[str, Any]] = [{"kind": "meta", "impl": impl, "switches": sorted(switches),
                                              "rank": rank, "world": world, "steps": steps,
                                              "identity": dict(identity)}]
        self._next_step = 0
        self._final_done = False
        self._closed = False
        try:  # an identity that cannot be written fails here, not after the whole run at close()
            json.dumps(self._lines[0], allow_nan=False)
        except (TypeError, ValueError) as e:
            raise RecordError(f"identity must be plain JSON (strings, numbers, lists, objects): {e}") from None

    # -------------------------------------------------------------------------------- recording

    def _items(self, where: str, items: Mapping[str, Any] | None, named: dict[str, Any]) -> dict[str, Any]:
        if self._closed:
            raise RecordError(f"{self.path}: {where} after close()")
        merged: dict[str, Any] = {}
        for source in (items or {}), named:
            for name, value in source.items():
                if not isinstance(name, str) or not name:
                    raise RecordError(f"{self.path}: {where}: item names must be non-empty strings, got {name!r}")
                if name in merged:
                    raise RecordError(f"{self.path}: {where}: item {name!r} given twice")
                merged[name] = encode_value(value, f"{self.path}: {where}: item {name!r}")
        if not merged:
            raise RecordError(f"{self.path}: {where}: no items (a line that records nothing cannot be compared)")
        return merged

    def step(self, step: int, items: Mapping[str, Any] | None = None, /, **named: Any) -> None:
        """Record step `step` (0, 1, ... in order, each once). Items come as keywords, or as a mapping for
        names that are not identifiers (``{"tokens.round1": digest}``)."""
        if self._final_done:
            raise RecordError(f"{self.path}: step {step} recorded after the final line")
        if step != self._next_step or isinstance(step, bool):
            done = f"steps 0–{self._next_step - 1} are recorded" if self._next_step else "no step is recorded yet"
            raise RecordError(f"{self.path}: step {step!r} out of order: {done}, so the next is step "
                              f"{self._next_step} (steps 0–{self.steps - 1}, in order, once each)")
        if step >= self.steps:
            raise RecordError(f"{self.path}: step {step} is past the last step {self.steps - 1} (steps={self.steps})")
        self._lines.append({"kind": "step", "step": step, "rank": self.rank,
                            "items": self._items(f"step {step}", items, named)})
        self._next_step += 1

    def final(self, items: Mapping[str, Any] | None = None, /, *, params=None, optimizer=None, **named: Any) -> None:
        """Record the state after the last step: every parameter as ``param.<name>`` (a mapping or
        ``model.named_parameters()``) and, with `optimizer`, every optimizer-state entry of those parameters as
        ``optim.<name>.<state>`` (tensors as digests, other values as IEEE hex, as the built-in subject)."""
        if self._final_done:
            raise RecordError(f"{self.path}: the final line is already recorded")
        if self._next_step != self.steps:
            raise RecordError(f"{self.path}: final line before step {self._next_step} (steps 0–{self.steps - 1} "
                              "must all be recorded first)")
        state_items: dict[str, Any] = {}
        named_params = list(params.items() if isinstance(params, Mapping) else params or ())
        for name, p in named_params:
            state_items[f"param.{name}"] = p if isinstance(p, str) else tensor_digest(p)
        if optimizer is not None:
            if not named_params:
                raise RecordError(f"{self.path}: final: optimizer state is named after its parameters; pass "
                                  "params=model.named_parameters() too")
            by_id = {id(p): name for name, p in named_params if not isinstance(p, str)}
            for p in optimizer.state:
                if id(p) not in by_id:
                    raise RecordError(f"{self.path}: final: the optimizer holds state for a tensor of shape "
                                      f"{tuple(p.shape)} that is not in params; it would escape the comparison")
            for name, p in named_params:
                if isinstance(p, str):
                    continue
                for key, value in sorted(optimizer.state.get(p, {}).items()):
                    state_items[f"optim.{name}.{key}"] = (tensor_digest(value) if _is_tensor(value)
                                                          else scalar_hex(value))
        overlap = set(state_items) & (set(items or {}) | set(named))
        if overlap:
            raise RecordError(f"{self.path}: final: item(s) {sorted(overlap)} given twice")
        self._lines.append({"kind": "final", "rank": self.rank,
                            "items": self._items("final", {**state_items, **(items or {})}, named)})
        self._final_done = True

    # -------------------------------------------------------------------------------- writing

    def text(self) -> str:
        """The file's content: one JSON object per line, keys sorted."""
        return "".join(json.dumps(line, sort_keys=True, allow_nan=False) + "\n" for line in self._lines)

    def close(self) -> Path:
        """Write the file (atomically) once every step and the final line are recorded; returns its path."""
        if self._closed:
            return self.path
        if self._next_step != self.steps:
            done = f"steps 0–{self._next_step - 1}" if self._next_step else "no step"
            raise RecordError(f"{self.path}: not written: {done} of 0–{self.steps - 1} recorded (step "
                              f"{self._next_step} is missing)")
        if not self._final_done:
            raise RecordError(f"{self.path}: not written: the final line (parameters, optimizer state) is missing")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(self.path, self.text())
        self._closed = True
        return self.path

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._closed = True  # a failed run leaves no record that could be compared
