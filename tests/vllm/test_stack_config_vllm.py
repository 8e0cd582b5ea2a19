"""The ``vllm:`` section of the local stack's config (deploy/local/stack.yaml): checked before
anything starts, with errors that name their location. Pure parsing: no vLLM needed."""

from __future__ import annotations

from typing import Any

import pytest

from services.localstack.config import (
    DEFAULT_VLLM_MODEL,
    StackConfigError,
    load_stack_config,
    parse_stack_config,
)
from services.localstack.main import DEFAULT_CONFIG


def config(vllm: Any) -> dict[str, Any]:
    return {"model": "meridian-sim", "regions": {"kr": {"rtt_ms": 4}}, "vllm": vllm}


def test_the_shipped_config_runs_one_cpu_vllm_worker_serving_the_tiny_model() -> None:
    shipped = load_stack_config(DEFAULT_CONFIG)

    assert shipped.vllm_regions == {"kr": 1}
    assert shipped.vllm_embedding_model == "tiny-embed"
    assert shipped.vllm_embedding_regions == {"kr": 1}
    assert shipped.served_model("vllm") == DEFAULT_VLLM_MODEL
    assert shipped.served_model("sim") == "meridian-sim"
    assert shipped.vllm_options == {
        "dtype": "float32",
        "max_model_len": 512,
        "max_num_seqs": 16,
        "gpu_memory_utilization": 0.15,
        "enforce_eager": True,
        "tool_call_parser": "hermes",
        "enable_auto_tool_choice": True,
        "structured_outputs_backend": "xgrammar",
        "structured_outputs_compact": True,
        "tool_call_constraint": "json",
    }


def test_a_missing_vllm_section_means_no_vllm_workers_and_the_default_model() -> None:
    parsed = parse_stack_config(config(None))

    assert parsed.vllm_regions == {}
    assert parsed.vllm_model == DEFAULT_VLLM_MODEL


@pytest.mark.parametrize(
    ("vllm", "message"),
    [
        ({"gpus": 1}, "vllm.gpus: unknown key"),
        ({"model": ""}, "vllm.model: must be a non-empty string"),
        ({"regions": {"us": 1}}, "vllm.regions.us: not one of the regions"),
        ({"regions": {"kr": 5}}, "vllm.regions.kr: must be an integer 0..4"),
        ({"regions": {"kr": True}}, "vllm.regions.kr: must be an integer 0..4"),
        ({"options": {"max_len": 256}}, "vllm.options.max_len: unknown option"),
        ({"options": {"enforce_eager": False}}, "vllm.options.enforce_eager: must be"),
        ({"options": {"dtype": ["float32"]}}, "vllm.options.dtype: must be"),
        ({"options": [1]}, "vllm.options: must be a mapping"),
    ],
)
def test_a_bad_vllm_section_is_refused_naming_the_key(vllm: Any, message: str) -> None:
    with pytest.raises(StackConfigError, match=message.replace(".", r"\.")):
        parse_stack_config(config(vllm))
