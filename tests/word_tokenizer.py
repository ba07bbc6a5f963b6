"""A word-level Hugging Face tokenizer over the words ``w0`` .. ``w43``, saved with ``save_pretrained`` (offline):
the tiny Hugging Face and OpenVINO folders of the tests read and write their text through it."""

from __future__ import annotations

from typing import Any

WORDS = [f"w{i}" for i in range(44)]
VOCAB = {"[PAD]": 0, "[BOS]": 1, "[EOS]": 2, "[UNK]": 3, **{w: 4 + i for i, w in enumerate(WORDS)}}


def save_word_tokenizer(folder: Any) -> Any:
    """The tokenizer over :data:`VOCAB` (pad 0, bos 1, eos 2, unk 3, words from 4), saved into ``folder``."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]"
    )
    tok.save_pretrained(folder)
    return tok
