"""Bounds on what a request may ask for, shared by the edge (OpenAI JSON) and the worker (gRPC),
so both sides reject the same things with the same words.

These are protocol-level limits (what OpenAI accepts), not per-tenant policy; the engine adds
its own model-specific limits (context length) on top.
"""

from __future__ import annotations

from typing import Final

TEMPERATURE_RANGE: Final = (0.0, 2.0)
TOP_P_RANGE: Final = (0.0, 1.0)  # exclusive of 0
PENALTY_RANGE: Final = (-2.0, 2.0)
MAX_TOP_LOGPROBS: Final = 20
MAX_STOP_SEQUENCES: Final = 4
MAX_STOP_LENGTH: Final = 256
MAX_TOKENS_CEILING: Final = 1_000_000
MAX_MESSAGES: Final = 2048
MAX_CONTENT_CHARS: Final = 1_000_000
MAX_REQUEST_ID_CHARS: Final = 128
MAX_MODEL_NAME_CHARS: Final = 256
MAX_TENANT_ID_CHARS: Final = 64  # the edge's tenant ids (tenancy/tenants.py TENANT_ID_PATTERN)
MAX_DECISION_ID_CHARS: Final = 128  # a router decision id (opaque; the router's are short)
MAX_TOOL_CALLS: Final = 128  # calls in one assistant message of the history
MAX_CALL_ID_CHARS: Final = 256  # a tool call's id, and a tool message's tool_call_id
MAX_FUNCTION_NAME_CHARS: Final = 64
CHAT_ROLES: Final = frozenset({"system", "developer", "user", "assistant", "tool"})

# Completions and embeddings (issue 12).
MAX_PROMPTS: Final = 16  # prompts in one completions request (each is a choice)
MAX_EMBEDDING_INPUTS: Final = 2048  # inputs in one embeddings request (OpenAI's limit)
MAX_PROMPT_TOKEN_IDS: Final = 262_144  # token ids in one prompt or embedding input
MAX_TOKEN_ID: Final = 2**31 - 1
MAX_CHOICES: Final = 128  # chat's n, at most, whatever a deployment allows
MAX_COMPLETION_CHOICES: Final = 64  # prompts × n in one completions request (one stream each)

# JSON schemas (tool parameters, response_format): how deeply objects and arrays may nest,
# counting the schema itself as 1. Schemas travel to the worker as protobuf Structs, three
# message levels per JSON object, and protobuf refuses to decode past 100 levels: a schema
# nested ~32 deep made the worker's whole GenerateMux call undecodable, every stream on it
# with it. 20 leaves room for the envelope and is twice what OpenAI's structured outputs
# allow (10 levels of properties).
MAX_SCHEMA_DEPTH: Final = 20
