"""The pretrained g2p-en grapheme-to-phoneme GRU, in numpy, as a beamkit step function.

The ``g2p-en`` package ships ``g2p_en/checkpoint20.npz``: a GRU encoder over letters whose last hidden state
starts a GRU decoder over ARPAbet phonemes (no attention). We locate that file with
``importlib.util.find_spec`` and never import ``g2p_en`` itself (its import downloads NLTK data). The decoder
state is a single array ``h`` (rows, hidden); the step is ``GRUCell(embed(y_prev), h) -> fc``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

GRAPHEMES = ("<pad>", "<unk>", "</s>", *"abcdefghijklmnopqrstuvwxyz")
# fmt: off
PHONEMES = (
    "<pad>", "<unk>", "<s>", "</s>",
    "AA0", "AA1", "AA2", "AE0", "AE1", "AE2", "AH0", "AH1", "AH2", "AO0", "AO1", "AO2", "AW0", "AW1", "AW2",
    "AY0", "AY1", "AY2", "B", "CH", "D", "DH", "EH0", "EH1", "EH2", "ER0", "ER1", "ER2", "EY0", "EY1", "EY2",
    "F", "G", "HH", "IH0", "IH1", "IH2", "IY0", "IY1", "IY2", "JH", "K", "L", "M", "N", "NG", "OW0", "OW1",
    "OW2", "OY0", "OY1", "OY2", "P", "R", "S", "SH", "T", "TH", "UH0", "UH1", "UH2", "UW", "UW0", "UW1", "UW2",
    "V", "W", "Y", "Z", "ZH",
)
# fmt: on
BOS, EOS = 2, 3  # decoder ids of <s> and </s>
SRC_EOS = 2  # grapheme id of </s>, appended to every word
MAX_LEN = 20  # g2p-en's own decoding limit
_KEYS = (
    "enc_emb", "enc_w_ih", "enc_w_hh", "enc_b_ih", "enc_b_hh",
    "dec_emb", "dec_w_ih", "dec_w_hh", "dec_b_ih", "dec_b_hh", "fc_w", "fc_b",
)  # fmt: skip


def checkpoint_path() -> Path:
    """Return the path of g2p-en's ``checkpoint20.npz`` without importing ``g2p_en``.

    Raises FileNotFoundError with the install command when the package (or its file) is missing.
    """
    spec = importlib.util.find_spec("g2p_en")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the g2p-en package is not installed: pip install g2p-en --no-deps")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / "checkpoint20.npz"
        if path.is_file():
            return path
    raise FileNotFoundError("g2p-en is installed but its checkpoint20.npz is missing")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def gru_cell(x: np.ndarray, h: np.ndarray, w_ih: np.ndarray, w_hh: np.ndarray, b_ih: np.ndarray, b_hh: np.ndarray):
    """One PyTorch-convention GRU cell step (gates r, z, n): x (rows, E), h (rows, H) -> (rows, H)."""
    gi = x @ w_ih.T + b_ih  # shape: (rows, 3H)
    gh = h @ w_hh.T + b_hh  # shape: (rows, 3H)
    hidden = h.shape[1]
    r = _sigmoid(gi[:, :hidden] + gh[:, :hidden])
    z = _sigmoid(gi[:, hidden : 2 * hidden] + gh[:, hidden : 2 * hidden])
    n = np.tanh(gi[:, 2 * hidden :] + r * gh[:, 2 * hidden :])
    return (1.0 - z) * n + z * h


@dataclass
class G2PModel:
    """The g2p-en GRU weights (float32 numpy arrays) with a batched encoder and a beamkit step function."""

    weights: dict[str, np.ndarray]

    @classmethod
    def load(cls, path: str | Path | None = None) -> G2PModel:
        """Load ``checkpoint20.npz`` (default: the one inside the installed g2p-en package)."""
        file = Path(path) if path is not None else checkpoint_path()
        if not file.is_file():
            raise FileNotFoundError(f"g2p checkpoint not found: {file}")
        try:
            with np.load(file) as data:
                weights = {k: np.asarray(data[k], dtype=np.float32) for k in _KEYS}
        except KeyError as exc:
            raise ValueError(f"corrupt g2p checkpoint {file}: missing array {exc}") from exc
        except (OSError, ValueError) as exc:
            raise ValueError(f"corrupt g2p checkpoint {file}: {exc}") from exc
        if weights["dec_emb"].shape[0] != len(PHONEMES) or weights["enc_emb"].shape[0] != len(GRAPHEMES):
            raise ValueError(f"g2p checkpoint {file} does not match the g2p-en vocabularies")
        return cls(weights)

    def encode_words(self, words: Sequence[str]) -> list[list[int]]:
        """Grapheme ids of each word plus ``</s>``; words must be non-empty lower-case a-z."""
        if isinstance(words, str):
            raise TypeError("expected a sequence of words, got one string")
        out = []
        for word in words:
            if not isinstance(word, str) or not word:
                raise ValueError(f"expected a non-empty word, got {word!r}")
            bad = sorted({ch for ch in word if not ("a" <= ch <= "z")})
            if bad:
                raise ValueError(f"word {word!r} has characters {bad!r}; g2p expects lower-case a-z")
            out.append([GRAPHEMES.index(ch) for ch in word] + [SRC_EOS])
        return out

    def init_state(self, words: Sequence[str]) -> np.ndarray:
        """Run the encoder GRU over each word; the decoder's initial state h (B, H), one row per word."""
        w = self.weights
        ids = self.encode_words(words)
        lengths = np.array([len(s) for s in ids])
        hidden = w["enc_w_hh"].shape[1]
        h = np.zeros((len(ids), hidden), dtype=np.float32)  # shape: (B, H)
        for t in range(int(lengths.max())):
            tok = np.array([s[t] if t < len(s) else 0 for s in ids])
            new = gru_cell(w["enc_emb"][tok], h, w["enc_w_ih"], w["enc_w_hh"], w["enc_b_ih"], w["enc_b_hh"])
            h = np.where((t < lengths)[:, None], new, h)  # finished words keep their last state
        return h

    def step(self, state: np.ndarray, y_prev: Any) -> tuple[np.ndarray, np.ndarray]:
        """beamkit step function: state h (rows, H), y_prev (rows,) -> logits (rows, V), new h."""
        w = self.weights
        y = np.asarray(y_prev, dtype=np.int64)
        h = gru_cell(w["dec_emb"][y], state, w["dec_w_ih"], w["dec_w_hh"], w["dec_b_ih"], w["dec_b_hh"])
        logits = h @ w["fc_w"].T + w["fc_b"]  # shape: (rows, V)
        return logits, h


def phonemes(tokens: Sequence[int]) -> list[str]:
    """ARPAbet symbols of decoder ids, stopping at ``</s>``."""
    out = []
    for t in tokens:
        if int(t) == EOS:
            break
        out.append(PHONEMES[int(t)])
    return out
