"""``beamkit serve --model ov:DIR``: requests sent concurrently (they join the running engine at different steps)
each get what ``beamkit.hf.generate`` gives them alone on the float32 model the IR was exported from.

Log-probabilities within 1e-5 (``tests.test_serve.same``): OpenVINO's float32 logits of this 2-layer, 32-wide
model differ from torch's by a few float32 roundings (~1e-6 each), summed over at most 10 tokens.
"""

from __future__ import annotations

import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("torch")
pytest.importorskip("openvino")

from beamkit.adapters import load as load_adapter  # noqa: E402
from tests.test_serve import same  # noqa: E402
from tests.test_serve_models import _hf_generate_alone, _hf_served, hf_dir  # noqa: E402, F401

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_ov_concurrent_requests_match_generate_alone(hf_dir, tmp_path):  # noqa: F811
    import beamkit.openvino as bo

    folder = bo.export_decoder(hf_dir, tmp_path / "ir")  # the folder's tokenizer is copied beside the IR
    want, _ = _hf_generate_alone(hf_dir)
    adapter = load_adapter(f"ov:{folder}")
    assert adapter.owned_by == "openvino"
    got, reasons = _hf_served(adapter)
    for prompt in want:
        same(got[prompt], want[prompt])
    assert reasons == {"stop", "length"}  # eos fired in some hypotheses, others ran to max_tokens
