"""The supported ``transformers`` releases: beamkit passes and reads the key/value cache under each release's own
names, so decoding emits none of the deprecations transformers 5.24 added for the old ones.

transformers 5.24 renamed the forward keyword ``past_key_values`` to ``cache`` (the old keyword warns with a
``FutureWarning`` on every call) and the output field likewise (reading ``past_key_values`` logs a deprecation).
On 5.23 the deprecation checks hold trivially; ``make hf-newest`` runs this module on the newest supported
release, where they are the real check. The expected names come from the installed release's version number,
not from the signature inspection under test.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from packaging.specifiers import SpecifierSet  # noqa: E402  (transformers depends on packaging)
from packaging.version import Version  # noqa: E402

import beamkit.hf as bh  # noqa: E402
from beamkit.hf.versions import TESTED_TRANSFORMERS, cache_keyword, output_cache  # noqa: E402
from tests.test_hf import MODELS, setup  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RENAMED = Version(transformers.__version__) >= Version("5.24")  # the release that renamed the cache

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class _Records(logging.Handler):
    """Keeps the messages logged under the ``transformers`` logger."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def no_cache_deprecation() -> Iterator[_Records]:
    """Raise on a warning about the deprecated cache names (``FutureWarning`` / ``DeprecationWarning`` naming
    ``past_key_values``) and collect what transformers logs; the caller asserts no logged line names them.
    transformers logs some deprecations once per process, so that memo is cleared first."""
    once = getattr(transformers.utils.logging, "warning_once", None)
    if hasattr(once, "cache_clear"):
        once.cache_clear()
    records = _Records()
    logger = logging.getLogger("transformers")
    logger.addHandler(records)
    try:
        with warnings.catch_warnings():
            for category in (FutureWarning, DeprecationWarning):
                warnings.filterwarnings("error", message=r".*past_key_values", category=category)
            yield records
    finally:
        logger.removeHandler(records)


def deprecations(records: _Records) -> list[str]:
    return [m for m in records.messages if "past_key_values" in m or "cache_params" in m]


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("gpt2", {"cache_implementation": "paged"}),  # paged keys/values (beamkit's own Cache)
        ("gpt2", {}),  # a model this small: the dense cache by size
        ("gpt2", {"cache_implementation": "dynamic"}),  # Hugging Face's DynamicCache
        ("gpt2", {"num_beams": 1}),  # greedy
        ("t5", {}),  # encoder-decoder: EncoderDecoderCache
        ("t5", {"num_beams": 1}),
    ],
)
def test_generate_uses_no_deprecated_cache_name(name, extra):
    model, ids, mask, _, _ = setup(name)
    kwargs = {"num_beams": 3, "max_new_tokens": 5, "min_new_tokens": 5, **extra}
    with no_cache_deprecation() as records:
        out = bh.generate(model, ids, attention_mask=mask, return_dict_in_generate=True, **kwargs)
    assert deprecations(records) == []
    assert out.stats.model_calls >= 5  # the steps after the first one passed a cache to the model


@pytest.mark.parametrize("name", MODELS)
def test_the_cache_keyword_is_the_releases_own(name):
    model = setup(name)[0]
    assert cache_keyword(model) == ("cache" if RENAMED else "past_key_values")
    step = bh.EncoderDecoderStep(model) if model.config.is_encoder_decoder else bh.DecoderOnlyStep(model)
    assert step.cache_key == cache_keyword(model)


def test_a_forward_without_a_signature_gets_the_name_every_release_takes():
    class Opaque:
        forward = staticmethod(len)  # a builtin: inspect.signature cannot read it

    assert cache_keyword(Opaque()) == "past_key_values"


def test_output_cache_is_the_cache_the_forward_returned():
    model, ids, mask, _, _ = setup("gpt2")
    with torch.no_grad(), no_cache_deprecation() as records:
        out = model(input_ids=ids, attention_mask=mask, use_cache=True, return_dict=True)
        cache = output_cache(out)
    assert deprecations(records) == []
    # positionally, the output holds (logits, cache) whatever the field is called
    assert cache is out.to_tuple()[1]
    assert isinstance(cache, transformers.Cache) and cache.get_seq_length() == ids.shape[1]


def test_the_extras_name_the_tested_range_and_it_holds_the_tested_releases():
    text = (ROOT / "pyproject.toml").read_text()
    for extra in ("hf", "hf-bench"):
        line = re.search(rf"^{extra} = \[(.*)\]$", text, flags=re.MULTILINE)
        assert line is not None, extra
        assert f'"transformers{TESTED_TRANSFORMERS}"' in line.group(1), line.group(0)
    tested = SpecifierSet(TESTED_TRANSFORMERS)
    pinned = re.search(r'"transformers==([^"]+)"', text)
    assert pinned is not None and pinned.group(1) in tested  # the dev extra's release is in the range
    newest = re.search(r"^HF_NEWEST_TRANSFORMERS := (\S+)$", (ROOT / "Makefile").read_text(), flags=re.MULTILINE)
    assert newest is not None and newest.group(1) in tested  # `make hf-newest` tests a release in the range...
    assert Version(newest.group(1)) > Version(pinned.group(1))  # ...other than the dev extra's
    assert transformers.__version__ in tested
