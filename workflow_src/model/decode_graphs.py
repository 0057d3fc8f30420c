"""One-token decode steps of the lean forward as CUDA graphs, with attention left eager: same kernels, same bits.

A decode step of `LeanQwen2` is embed → per layer (qkv → attend → mlp block) → final norm and lm_head.
Everything but `attend` has the same shapes at every step for a given row count; `attend` writes the
cache at each group's position and runs SDPA over that group's exact key length, which changes every
step. So the step is cut at the attention calls: piece 0 = embed + layer 0's qkv, piece i = layer i-1's
mlp block + layer i's qkv, the last piece = the last mlp block + final norm + lm_head. On a GPU each
piece is captured once per row count as a CUDA graph and replayed; between pieces the attention runs
eagerly exactly as in `LeanQwen2.hidden`, and its output is copied into the buffer the next piece reads.
A replayed graph launches the kernels its capture recorded, with the same shapes and arguments, so the
bits are the eager step's: a host-bound step (~25 small kernels per layer) becomes 25 graph launches plus
the attention calls. Weights are read where they lie (in-place updates are seen).

On the CPU the same pieces run eagerly through the same buffers (no graphs), so the sequencing is tested
there; the capture itself needs a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from workflow_src.model.graph_capture import safe_capture

if TYPE_CHECKING:  # LeanQwen2 builds its DecodeGraphs: the names are for annotations only
    from workflow_src.model.lean_qwen2 import LeanQwen2, Segment


class DecodeGraphs:
    """The decode step of `lean` for exactly `rows` rows (one token each)."""

    def __init__(self, lean: LeanQwen2, rows: int):
        self.lean, self.rows = lean, rows
        device = lean.cos.device
        n = len(lean.layers)
        self.ids = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(rows, 1, dtype=torch.long, device=device)
        width = lean.layers[0].self_attn.o_proj.weight.shape[1]
        dtype = lean.model.model.embed_tokens.weight.dtype
        self.o = [torch.zeros(rows, 1, width, dtype=dtype, device=device) for _ in range(n)]
        # outputs of piece i: (h_i, q_i, k_i, v_i) for i < n (plus cos, sin from piece 0); logits from piece n
        self.out: list[tuple[torch.Tensor, ...]] = [() for _ in range(n + 1)]
        self.pieces: list[Callable[[], tuple[torch.Tensor, ...]]] = [self._piece(i) for i in range(n + 1)]
        self.graphs: list[torch.cuda.CUDAGraph] | None = None
        for i, piece in enumerate(self.pieces):  # eager once: the static outputs (and a warm-up on a GPU)
            self.out[i] = piece()
        if device.type == "cuda":
            self._capture()

    def _piece(self, i: int) -> Callable[[], tuple[torch.Tensor, ...]]:
        lean, n = self.lean, len(self.lean.layers)

        def first():
            h, cos, sin = lean._embed(self.ids, self.pos)
            return (h, *lean._qkv(0, h, cos, sin), cos, sin)

        def middle():
            h_prev, cos, sin = self.out[i - 1][0], self.out[0][4], self.out[0][5]
            h = lean._mlp_block(i - 1, h_prev, self.o[i - 1])
            return (h, *lean._qkv(i, h, cos, sin))

        def last():
            h = lean._mlp_block(n - 1, self.out[n - 1][0], self.o[n - 1])
            return (lean.logits(lean.rms(lean.model.model.norm, h)[:, -1:, :]),)

        return first if i == 0 else last if i == n else middle

    def _capture(self) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # lazy initializations (cuBLAS handles, Triton launches) before capture
            for i, piece in enumerate(self.pieces):
                self.out[i] = piece()
        torch.cuda.current_stream().wait_stream(stream)
        pool = torch.cuda.graph_pool_handle()
        self.graphs = []
        for i, piece in enumerate(self.pieces):
            g = torch.cuda.CUDAGraph()
            with safe_capture(g, pool=pool):
                self.out[i] = piece()  # later pieces read these tensors: kept alive, never reused by the pool
            self.graphs.append(g)

    def release(self) -> None:
        """Drop the graphs and buffers now (the pieces' closures hold `self` in a reference cycle)."""
        self.graphs, self.out, self.pieces, self.o = None, [], [], []

    def _run(self, i: int) -> None:
        if self.graphs is not None:
            self.graphs[i].replay()
        else:
            for static, new in zip(self.out[i], self.pieces[i]()):
                static.copy_(new)

    @torch.no_grad()
    def step(self, ids: torch.Tensor, segments: list[Segment]) -> torch.Tensor:
        """Logits [rows, 1, vocab] of one token per row, as `LeanQwen2.forward(ids, segments)` computes them.
        The result lives in a static buffer: read it before the next step."""
        lean = self.lean
        self.ids.copy_(ids)
        self.pos.copy_(lean._positions(ids, segments))
        for li in range(len(lean.layers)):
            self._run(li)
            _, qs, ks, vs = self.out[li][:4]
            self.o[li].copy_(lean._attend(li, qs, ks, vs, segments))
        self._run(len(lean.layers))
        return self.out[-1][0]
