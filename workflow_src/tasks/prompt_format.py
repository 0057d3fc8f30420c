"""How a task's prompt text reaches the model (`task.prompt_format`): as it is, or as the user turn of the
tokenizer's chat template with the assistant's turn opened (an instruct model prompted without its template is
not the model that was published). Every engine generates from the formatted text, so all of them see the same
prompts.

- `plain`: the prompt text unchanged.
- `chat`: `tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
  tokenize=False)`, no system message of our own (a template that adds a default one, as Qwen2.5's does, adds it).
- `auto`: chat when the tokenizer has a chat template, plain otherwise (the synthetic checkpoints have none).
"""

from __future__ import annotations

from collections.abc import Sequence

FORMATS = ("auto", "chat", "plain")


def resolved_format(tokenizer, requested: str) -> str:
    """chat or plain for this tokenizer; chat without a template is an error naming the key."""
    if requested not in FORMATS:
        raise ValueError(f"task.prompt_format: {requested!r}; one of {', '.join(FORMATS)}")
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if requested == "chat" and not has_template:
        raise ValueError("task.prompt_format: chat, but the checkpoint's tokenizer has no chat template (use plain "
                         "or auto)")
    if requested == "auto":
        return "chat" if has_template else "plain"
    return requested


def format_prompts(tokenizer, prompts: Sequence[str], fmt: str) -> list[str]:
    """The texts the engines generate from, for a resolved format (chat or plain)."""
    if fmt == "plain":
        return list(prompts)
    if fmt != "chat":
        raise ValueError(f"format_prompts takes a resolved format (chat or plain), not {fmt!r}")
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                          tokenize=False) for p in prompts]
