"""VllmConfig: validated at construction, and what it hands to vLLM's AsyncEngineArgs."""

from __future__ import annotations

from typing import Any

import pytest

from services.worker.vllm.config import VllmConfig


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"model": " "}, "model"),
        ({"served_model_name": ""}, "served_model_name"),
        ({"dtype": "int4"}, "dtype"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
        ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 1.01}, "gpu_memory_utilization"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"scheduling_policy": "lifo"}, "scheduling_policy"),
        ({"load_window_s": 0.0}, "load_window_s"),
        ({"gpu_stats_max_age_s": -1.0}, "gpu_stats_max_age_s"),
    ],
)
def test_invalid_fields_are_refused_by_name(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        VllmConfig(**{"model": "/models/llama", **fields})


def test_the_served_name_defaults_to_the_model() -> None:
    assert VllmConfig(model="org/model").name == "org/model"
    assert VllmConfig(model="/m", served_model_name="chat").name == "chat"


def test_engine_args_carry_every_setting_and_keep_stats_on() -> None:
    config = VllmConfig.cpu_test("/models/tiny", served_model_name="tiny")

    assert config.engine_kwargs() == {
        "model": "/models/tiny",
        "served_model_name": ["tiny"],
        "dtype": "float32",
        "max_model_len": 256,
        "max_num_seqs": 16,
        "gpu_memory_utilization": 0.15,
        "tensor_parallel_size": 1,
        "enforce_eager": True,
        "enable_prefix_caching": True,
        "scheduling_policy": "fcfs",
        "seed": 0,
        "disable_log_stats": True,
    }


def test_the_engine_args_are_accepted_by_vllm() -> None:
    engine_args = pytest.importorskip("vllm.engine.arg_utils")

    args = engine_args.AsyncEngineArgs(**VllmConfig.cpu_test("/models/tiny").engine_kwargs())

    assert args.max_model_len == 256
