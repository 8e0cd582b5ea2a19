"""SimConfig: defaults that look like a small GPU server, validation that names the bad key."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from services.worker.sim.config import SimConfig, SimConfigError


def test_defaults_describe_a_small_gpu_server() -> None:
    c = SimConfig()
    assert c.models == ("meridian-sim",)
    assert (c.max_num_seqs, c.kv_cache_tokens, c.max_model_len) == (64, 32768, 8192)
    assert (c.prefill_ms_per_token, c.decode_base_ms, c.decode_ms_per_seq) == (0.02, 6.0, 0.15)
    assert c.num_kv_blocks == 32768 // 16


def test_is_frozen_and_keyword_only() -> None:
    c = SimConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.max_num_seqs = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        SimConfig(("m",))  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"models": ()}, "models"),
        ({"models": ("a", "a")}, "models"),
        ({"models": ("",)}, "models"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"max_num_batched_tokens": -1}, "max_num_batched_tokens"),
        ({"block_size": 0}, "block_size"),
        ({"kv_cache_tokens": 8, "block_size": 16}, "kv_cache_tokens"),
        ({"kv_cache_tokens": 4096, "max_model_len": 8192}, "kv_cache_tokens"),
        ({"prefill_ms_per_token": -0.1}, "prefill_ms_per_token"),
        ({"decode_base_ms": 0.0}, "decode_base_ms"),
        ({"decode_ms_per_seq": float("nan")}, "decode_ms_per_seq"),
        ({"time_scale": 0.0}, "time_scale"),
        ({"time_scale": float("inf")}, "time_scale"),
        ({"stats_window_s": -1.0}, "stats_window_s"),
        ({"load_delay_s": -1.0}, "load_delay_s"),
        ({"output_len_min": 0}, "output_len_min"),
        ({"output_len_min": 50, "output_len_max": 40}, "output_len_max"),
        ({"embedding_dimensions": 0}, "embedding_dimensions"),
        ({"embedding_dimensions": 4097}, "embedding_dimensions"),
        ({"max_waiting": -1}, "max_waiting"),
        ({"gpu_memory_utilization": 1.2}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
        ({"max_num_seqs": True}, "max_num_seqs"),
        ({"chunked_prefill": False, "max_num_batched_tokens": 2048}, "max_num_batched_tokens"),
    ],
)
def test_construction_rejects_bad_values_naming_the_key(kwargs: dict[str, Any], key: str) -> None:
    with pytest.raises(SimConfigError) as info:
        SimConfig(**kwargs)
    assert info.value.key == key
    assert key in str(info.value)


def test_from_mapping_builds_and_coerces() -> None:
    c = SimConfig.from_mapping(
        {
            "models": ["a", "b"],
            "decode_base_ms": 5,  # an int where a float is expected
            "max_waiting": None,
            "chunked_prefill": True,
            "time_scale": 0.5,
        }
    )
    assert c.models == ("a", "b")
    assert c.decode_base_ms == 5.0
    assert isinstance(c.decode_base_ms, float)
    assert c.max_waiting is None
    assert c.time_scale == 0.5
    assert SimConfig.from_mapping({"models": "solo"}).models == ("solo",)
    assert SimConfig.from_mapping({}) == SimConfig()


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"decode_base": 5.0}, "decode_base"),
        ({"max_num_seqs": "64"}, "max_num_seqs"),
        ({"max_num_seqs": 6.5}, "max_num_seqs"),
        ({"max_num_seqs": None}, "max_num_seqs"),
        ({"decode_base_ms": "fast"}, "decode_base_ms"),
        ({"decode_base_ms": False}, "decode_base_ms"),
        ({"chunked_prefill": "yes"}, "chunked_prefill"),
        ({"models": [1, 2]}, "models"),
        ({"decode_base_ms": -3}, "decode_base_ms"),
    ],
)
def test_from_mapping_errors_name_the_key(values: dict[str, Any], key: str) -> None:
    with pytest.raises(SimConfigError) as info:
        SimConfig.from_mapping(values)
    assert info.value.key == key
