"""The static engine's host side: which prompt enters which slot when, and how many rows a step runs over.

The schedule fills every slot from the prompt queue with one batched prefill, then launches one decode step
over the slots at a time (SlotDecoder.advance). A slot whose sequence ended (a stop token or max_new_tokens)
is refilled from the queue with a prefill into that slot, so the batch stays full until the queue runs dry.
The host launches each decode step before it reads the previous step's tokens (`overlap`; what the tokens
decide, which slots end and are refilled, is known one step later; the tokens are the same).

Ragged ends. Once no prompt waits, the slots still decoding can leave the ended ones behind (`compact`, the
GPU default): when they fit in a smaller row count of `row_counts` (the slots, each multiple of 8 below, 4, 2,
1), those at or above it move into free slots below it (their keys and values up to the position each feeds
next, every layer's at once) and the steps run over that many rows (one graph each), so the GEMMs, norms and
attention of a batch's long tail serve its live rows only, as an engine that batches live sequences (vLLM)
does. A GEMM's kernel, and so its rounding, can depend on its row count: with `compact` a row's logits can
differ from those of the same row in a full batch in the last bits; which rows a step holds is a pure function
of the prompts and the tokens, so the tokens stay the same run to run.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection

import torch

from workflow_src.engine.base import DECODE, PREFILL, PhaseClock
from workflow_src.engine.decoder import SlotDecoder


def row_counts(slots: int) -> list[int]:
    """The row counts a compacted step runs over, largest first: `slots`, every multiple of 8 below it, and
    4, 2, 1 (one CUDA graph each once reached)."""
    return sorted({slots, *range(8, slots, 8), *(n for n in (4, 2, 1) if n < slots)}, reverse=True)


class SlotSchedule:
    """One generation call over a SlotDecoder: the queues of items (indices into `encoded`), the item each slot
    decodes (`owner`) and its position (`where`) as the host knows them, each item's tokens so far, and the
    steps launched but not yet read (`unread`). The decoder's tokens and positions, which slots still decode
    (`live`) and how many tokens each may still make (`left`) live on the device and are advanced there by each
    step, so the next step can be launched before the host has read this one's tokens.

    `lanes`: the slots fall into that many equal blocks, block b decoding items b·n … (b + 1)·n − 1 of
    `encoded` (n = len(encoded) / lanes) and no other (a population decode's seed blocks). No compaction with
    more than one lane: a block's slots stay its own. `admitted(length)` is called for each prompt prefilled;
    `ended(item, tokens, stopped)` as each item's sequence ends (`stopped`: its last token is a stop token).
    `phases`: marked `prefill` where an admission starts and `decode` where a step is launched (a compaction and
    the reading of steps belong to the decode), each step counted."""

    def __init__(self, decoder: SlotDecoder, encoded: list[list[int]], limits: list[int], stops: Collection[int],
                 admitted: Callable[[int], None], ended: Callable[[int, list[int], bool], None], lanes: int = 1,
                 phases: PhaseClock | None = None):
        self.decoder, self.encoded, self.limits, self.stops = decoder, encoded, limits, stops
        self.phases = phases
        self.on_admitted, self.on_ended, self.lanes = admitted, ended, lanes
        self.per_block, per_lane = decoder.slots // lanes, len(encoded) // lanes
        self.queues = [deque(range(b * per_lane, (b + 1) * per_lane)) for b in range(lanes)]
        self.generated: list[list[int]] = [[] for _ in encoded]
        self.owner: list[int | None] = [None] * decoder.slots  # the item each slot decodes, as the host knows it
        self.where = [0] * decoder.slots  # positions as the host knows them (an upper bound while a step is unread)
        self.unread: deque = deque()  # launched steps: (their tokens on the host once the event fires, event, owners)
        self.ladder = row_counts(decoder.slots)
        self.rows = decoder.slots  # the steps run over slots 0..rows-1; every occupied slot is below rows
        decoder.live.zero_()
        decoder.left.zero_()
        decoder.positions.zero_()

    def run(self, overlap: bool, compact: bool) -> None:
        """Generate every item. `overlap`: the host reads step t while step t+1 runs. A slot that ends at step t
        is already frozen on the device in step t+1 (its token there is dropped); its refill is prefilled after
        step t+1 instead of before it. Each row's tokens depend on that row alone, and the slots freed together
        are prefilled together either way, so both orders give the same tokens (the tests compare them).

        `compact`: once the queue is empty, when a step read leaves live slots that fit a smaller row count of
        `row_counts`, the step in flight is read too, the live slots at or above the new count move into the
        free slots below it, and the steps run over that many rows. With overlap a refill, and so a queue
        that runs dry, comes a step later; rows then meet other row counts at other tokens than without, so
        on a GPU, where a GEMM's rounding can follow its row count, the two orders' tokens may differ in
        near-ties (each order repeats its own)."""
        lag = 1 if overlap else 0
        self.admit()
        while True:
            decoding = any(o is not None for o in self.owner)
            if decoding:
                self.launch()
            if self.unread and (len(self.unread) > lag or not decoding):
                self.read()
                if compact and self.compactable():
                    self.compact()
            elif not decoding:
                if not any(self.queues):
                    return
                self.admit()  # every admitted sequence ended at its prefill: admit more while the queue lasts

    def fitting(self, n: int) -> int:
        """The smallest row count of the ladder that holds `n` slots."""
        return min(b for b in self.ladder if b >= max(n, 1))

    def occupied(self) -> int:
        """Slots below `rows` that hold an item."""
        return sum(o is not None for o in self.owner[:self.rows])

    def admit(self) -> None:
        """Prefill the next items of each free slot's queue into it and record their first tokens."""
        decoder, device = self.decoder, self.decoder.tokens.device
        free = [slot for slot, o in enumerate(self.owner) if o is None]
        taken = [(slot, self.queues[slot // self.per_block].popleft()) for slot in free
                 if self.queues[slot // self.per_block]]
        if not taken:
            return
        if self.phases is not None:
            self.phases.enter(PREFILL)
        slots, idx = [s for s, _ in taken], [i for _, i in taken]
        decoder.admitted(slots, idx)
        logits = decoder.prefill([self.encoded[i] for i in idx], slots)
        at = torch.tensor(slots, device=device)
        lengths = [len(self.encoded[i]) for i in idx]
        decoder.positions[at] = torch.tensor(lengths, device=device)
        decoder.live[at] = 1
        decoder.left[at] = torch.tensor([self.limits[i] - 1 for i in idx], device=device)
        first = logits.argmax(-1)
        decoder.tokens[at] = first
        for slot, i, length in zip(slots, idx, lengths):
            self.owner[slot], self.where[slot] = i, length
            self.on_admitted(length)
        ended = self.record(first.tolist(), idx, slots)
        if ended:
            at = torch.tensor(ended, device=device)
            decoder.live[at] = 0
            decoder.positions[at] = 0

    def launch(self) -> None:
        """Launch one step over the first `rows` slots; its tokens are copied to the host without waiting."""
        if self.phases is not None:
            self.phases.enter(DECODE)
            self.phases.step()
        snapshot = [(slot, o) for slot, o in enumerate(self.owner) if o is not None]
        nxt = self.decoder.advance(max(self.where[s] for s, _ in snapshot), self.rows)
        for s, _ in snapshot:
            self.where[s] += 1
        if self.decoder.tokens.device.type == "cuda":
            event = torch.cuda.Event()
            picked = torch.empty(nxt.shape, dtype=nxt.dtype, pin_memory=True)  # a copy the host need not wait for
            picked.copy_(nxt, non_blocking=True)
            event.record()
        else:
            picked, event = nxt.clone(), None
        self.unread.append((picked, event, snapshot))

    def read(self) -> None:
        """Read the oldest launched step's tokens, record them, and refill the slots they freed."""
        picked, event, snapshot = self.unread.popleft()
        if event is not None:
            event.synchronize()
        new = picked.tolist()
        # a slot whose sequence ended at an earlier step (or that has been refilled since) was frozen
        current = [(s, o) for s, o in snapshot if self.owner[s] == o]
        self.record([new[s] for s, _ in current], [o for _, o in current], [s for s, _ in current])
        self.admit()

    def compactable(self) -> bool:
        """Whether the live slots fit a smaller row count, with one lane and nothing left to admit."""
        return (self.lanes == 1 and not self.queues[0] and self.rows > 1
                and self.fitting(self.occupied()) < self.rows)

    def compact(self) -> None:
        """Read every launched step, move the live slots at or above the fitting row count into free slots below
        it, and run the next steps over that many rows."""
        while self.unread:
            self.read()
        target = self.fitting(self.occupied())
        movers = [slot for slot in range(target, self.rows) if self.owner[slot] is not None]
        holes = [slot for slot in range(target) if self.owner[slot] is None][:len(movers)]
        # a mover's keys up to the position it feeds next are all it has written
        self.decoder.move_slots(movers, holes, 1 + max((self.where[s] for s in movers), default=0))
        for src, dst in zip(movers, holes):
            self.owner[dst], self.where[dst], self.owner[src] = self.owner[src], self.where[src], None
        self.rows = target

    def record(self, new: list[int], idx: list[int], slots: list[int]) -> list[int]:
        """Append each slot's new token; free (and return) the slots whose sequence ended, and report each ended
        item now (`ended`): the host waits on the device during the steps, and a text decode at the end of the
        call would keep the device waiting on the host."""
        freed = []
        for tok, i, slot in zip(new, idx, slots):
            self.generated[i].append(tok)
            stop = tok in self.stops
            if stop or len(self.generated[i]) >= self.limits[i]:
                self.owner[slot] = None
                freed.append(slot)
                self.on_ended(i, self.generated[i], stop)
        return freed
