"""``--engine openai``: the worker's command line → an :class:`UpstreamEngine`.

    python -m services.worker --engine openai --upstream-url http://10.0.0.7:8000/v1 \\
        [--upstream-api-key-file F] [--upstream-model NAME] [--served-model-name NAME] \\
        [--max-num-seqs 256] [--upstream-timeout-s 10] [--upstream-wait-s 30] \\
        [--upstream-metrics auto|off] --region us --worker-id us-1

Flags are checked here, before anything listens; whether the upstream answers is checked by
``UpstreamEngine.start()`` (the worker reports LOADING meanwhile), with an error that names
``--upstream-url`` when it does not.
"""

from __future__ import annotations

import argparse

from services.common import cli
from services.worker.engine import Engine, EngineConfigError
from services.worker.upstream.config import UpstreamConfig, read_api_key


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``openai engine`` flag group (the model flags are shared with the other engines)."""
    g = parser.add_argument_group("openai engine (fronts an OpenAI-compatible server)")
    g.add_argument("--upstream-url", help="the upstream's OpenAI base URL, http://host:port/v1")
    g.add_argument("--upstream-api-key-file", help="a file holding the upstream's API key")
    g.add_argument("--upstream-model", help="serve only this upstream model (default: all)")
    g.add_argument(
        "--upstream-timeout-s",
        type=cli.positive_float,
        default=10.0,
        help="connect + response-header timeout per request (default: %(default)s)",
    )
    g.add_argument(
        "--upstream-wait-s",
        type=cli.non_negative_float,
        default=30.0,
        help="how long start-up waits for the upstream's /v1/models (default: %(default)s)",
    )
    g.add_argument(
        "--upstream-metrics",
        choices=["auto", "off"],
        default="auto",
        help="auto: read queue and KV use from a vLLM upstream's /metrics (default: auto)",
    )


def from_args(args: argparse.Namespace) -> Engine:
    if not args.upstream_url:
        raise EngineConfigError("--upstream-url is required with --engine openai")
    api_key = read_api_key(args.upstream_api_key_file) if args.upstream_api_key_file else None
    config = UpstreamConfig(
        base_url=args.upstream_url,
        api_key=api_key,
        upstream_model=args.upstream_model,
        served_model_name=args.served_model_name,
        max_model_len=args.max_model_len,
        max_concurrency=args.max_num_seqs if args.max_num_seqs is not None else 256,
        connect_timeout_s=args.upstream_timeout_s,
        start_wait_s=args.upstream_wait_s,
        scrape_metrics=args.upstream_metrics == "auto",
    )
    from services.worker.upstream.engine import UpstreamEngine

    return UpstreamEngine(config)
