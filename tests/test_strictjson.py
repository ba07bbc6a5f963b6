"""``beamkit.strictjson.finite``: the one replacement of non-finite numbers the server's bodies and the corpus
runner's records share, checked against values worked by hand."""

from __future__ import annotations

import json
import math

from beamkit.strictjson import finite


def test_non_finite_floats_become_null_at_any_depth():
    payload = {"score": -math.inf, "rows": [1.5, math.nan, (math.inf, 2)], "text": "a", "n": 3, "ok": True}
    want = {"score": None, "rows": [1.5, None, [None, 2]], "text": "a", "n": 3, "ok": True}
    assert finite(payload) == want
    assert json.loads(json.dumps(finite(payload), allow_nan=False)) == want
    assert payload["score"] == -math.inf  # the caller's payload is left as it was
