"""The unit every task yields: one problem with its prompt, reference solution and canonical answer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    id: str
    prompt: str
    solution: str
    answer: str

    @property
    def text(self) -> str:
        """The problem as one plain document, the unit of pretraining and of bits-per-byte."""
        return self.prompt + self.solution
