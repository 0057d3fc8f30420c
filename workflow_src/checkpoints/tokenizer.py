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

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)


def _byte_level(ch: str) -> str:
    (piece, _), = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(ch)
    return piece


def build_tokenizer(alphabet: str, model_max_length: int) -> PreTrainedTokenizerFast:
    chars = sorted(set(alphabet))
    if not chars:
        raise ValueError("tokenizer alphabet is empty")
    if any(len(ch.encode("utf-8")) != 1 for ch in chars):
        raise ValueError(f"tokenizer alphabet must be ASCII (one byte, so one token, per character): {alphabet!r}")
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *(_byte_level(ch) for ch in chars)])}
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
