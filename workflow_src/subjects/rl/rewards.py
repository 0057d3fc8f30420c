"""Rewards for completions: task grading, in process, synchronously or overlapped in a thread.

The reward service (HTTP, gunicorn) replaces the in-process grader behind the same submit/resolve
interface; a failure is an exception, never a silent zero.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from workflow_src.tasks.registry import get_task


class InProcessRewards:
    def __init__(self, overlap: bool, task: str = "synthetic_arithmetic"):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rewards") if overlap else None
        self._task = get_task(task)

    def score(self, completions: list[str], answers: list[str], ids: list[list[int]] | None = None) -> list[float]:
        return [self._task.grade(c, a) for c, a in zip(completions, answers)]

    def submit(self, completions: list[str], answers: list[str],
               ids: list[list[int]] | None = None) -> Future | list[float]:
        """`ids` (the completions' token ids) are for a model-scored service; grading reads the text alone."""
        if self._pool is None:
            return self.score(completions, answers)
        return self._pool.submit(self.score, completions, answers)

    @staticmethod
    def resolve(handle: Future | list[float]) -> list[float]:
        return handle.result() if isinstance(handle, Future) else handle

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
