"""Character-level tokenizer for synthetic checkpoints: one token per character, no merges.

transformers 5 does not load a Qwen2 checkpoint's tokenizer from tokenizer.json as saved:
`AutoTokenizer` sees `model_type: qwen2` and rebuilds it as `Qwen2Tokenizer`, keeping only the
vocabulary, merges and post-processor and imposing Qwen2's own normalizer (NFC), pre-tokenizer
(regex split + byte-level) and byte-level decoder. A plain character vocabulary would then lose
every character whose byte-level form differs (space and newline). So the tokenizer is built
as exactly that pipeline with an empty merge list: its vocabulary holds the byte-level form of
each alphabet character, every character is its own token, and whichever class loads the
directory (`Qwen2Tokenizer`, `TokenizersBackend`, another engine) produces the same ids.

Ids: <pad>=0, <bos>=1, <eos>=2, <unk>=3, then the alphabet in character order, so one alphabet
always gives one vocabulary. <unk> is declared only so `Qwen2Tokenizer` does not add its default
`<|endoftext|>` as a new token on load; it is never produced (like Qwen2's tokenizer, characters
outside the alphabet are dropped, and the task never produces any).
"""

from __future__ import annotations

import itertools

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)


def _byte_level(ch: str) -> str:
    (piece, _), = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(ch)
    return piece


def _filler(pieces: list[str], count: int) -> list[str]:
    """`count` distinct strings of 2 or more pieces, shortest first, in a fixed order."""
    out: list[str] = []
    for length in itertools.count(2):
        for combo in itertools.product(pieces, repeat=length):
            if len(out) == count:
                return out
            out.append("".join(combo))
    return out


def build_tokenizer(alphabet: str, model_max_length: int, vocab_size: int | None = None) -> PreTrainedTokenizerFast:
    """`vocab_size`: fill the vocabulary up to that many ids with multi-character strings of the alphabet.
    Text still encodes one token per character (there are no merges), but every id decodes to text: a
    random-weight model's samples read as random strings of the task's characters."""
    chars = sorted(set(alphabet))
    if not chars:
        raise ValueError("tokenizer alphabet is empty")
    if any(len(ch.encode("utf-8")) != 1 for ch in chars):
        raise ValueError(f"tokenizer alphabet must be ASCII (one byte, so one token, per character): {alphabet!r}")
    pieces = [_byte_level(ch) for ch in chars]
    tokens = [*SPECIAL_TOKENS, *pieces]
    if vocab_size is not None:
        if vocab_size < len(tokens):
            raise ValueError(f"vocab_size {vocab_size} is smaller than the alphabet's {len(tokens)} tokens")
        tokens += _filler(pieces, vocab_size - len(tokens))
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    # Every sequence starts with <bos>, so the first real character is predicted from a fixed context.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        model_max_length=model_max_length,
    )
