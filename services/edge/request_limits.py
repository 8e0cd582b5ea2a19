"""``RequestLimits``: what one request may carry, whoever sends it (tenant policy on top)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common import limits as protocol


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestLimits:
    """What one request may carry, whoever sends it (tenant policy comes on top)."""

    max_body_bytes: int = 4 * 1024 * 1024
    max_messages: int = 512
    max_prompt_chars: int = 1_000_000
    # Embeddings: inputs per request and characters per input (token ids: MAX_PROMPT_TOKEN_IDS).
    max_embedding_inputs: int = protocol.MAX_EMBEDDING_INPUTS
    max_input_chars: int = 100_000
    # Chat: the most choices (``n``) one request may ask for.
    max_choices: int = 16

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be >= 1024")
        if self.max_messages < 1 or self.max_prompt_chars < 1:
            raise ValueError("max_messages and max_prompt_chars must be >= 1")
        if not 1 <= self.max_embedding_inputs <= protocol.MAX_EMBEDDING_INPUTS:
            raise ValueError(f"max_embedding_inputs must be 1..{protocol.MAX_EMBEDDING_INPUTS}")
        if not 1 <= self.max_choices <= protocol.MAX_CHOICES:
            raise ValueError(f"max_choices must be in 1..{protocol.MAX_CHOICES}")
        if self.max_input_chars < 1:
            raise ValueError("max_input_chars must be >= 1")
