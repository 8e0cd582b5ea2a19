"""OpenAI's embeddings response: ``{"object": "list", "data": [{"object": "embedding",
"index", "embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}``.

``encoding_format: "base64"`` is the vector's little-endian float32 bytes in base64, as
OpenAI sends it (the SDK decodes it with ``np.frombuffer(..., dtype="float32")``).
"""

from __future__ import annotations

import array
import base64
import sys
from typing import Any

from meridian.v1 import worker_pb2


def base64_floats(values: Any) -> str:
    buf = array.array("f", values)
    if sys.byteorder != "little":
        buf.byteswap()
    return base64.b64encode(buf.tobytes()).decode("ascii")


def embeddings_body(
    *, model: str, response: worker_pb2.EmbedResponse, encoding_format: str
) -> dict[str, Any]:
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": (
                base64_floats(e.values) if encoding_format == "base64" else list(e.values)
            ),
        }
        for i, e in enumerate(response.embeddings)
    ]
    tokens = response.usage.prompt_tokens
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
