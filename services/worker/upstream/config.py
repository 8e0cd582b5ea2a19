"""The settings of an upstream engine, checked once so that a typo stops the worker at once.

Every message names the flag it came from: the worker's ``main`` prints it as a usage error
(exit code 2) before anything listens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from services.worker.engine import EngineConfigError

#: An upstream API key longer than this is a wrong file, not a key.
MAX_API_KEY_CHARS = 4096
MAX_MODEL_NAME_CHARS = 256


def normalize_base_url(url: str) -> str:
    """``--upstream-url`` as the OpenAI SDKs take it (``http://host:port/v1``), without a
    trailing slash. Only http(s), a host, no query, fragment or credentials (a key in a URL
    ends up in logs: use ``--upstream-api-key-file``)."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port  # raises ValueError on a bad port
    except ValueError as err:
        raise EngineConfigError(f"--upstream-url {url!r}: {err}") from None
    if parts.scheme not in ("http", "https"):
        raise EngineConfigError(f"--upstream-url {url!r}: the scheme must be http or https")
    if not parts.hostname:
        raise EngineConfigError(f"--upstream-url {url!r}: no host")
    if parts.username or parts.password:
        raise EngineConfigError(
            "--upstream-url must not carry credentials; put the key in --upstream-api-key-file"
        )
    if parts.query or parts.fragment:
        raise EngineConfigError(f"--upstream-url {url!r}: no query or fragment allowed")
    del port
    return url.strip().rstrip("/")


def read_api_key(path: str) -> str:
    """The key in ``--upstream-api-key-file`` (one line; surrounding whitespace ignored)."""
    try:
        with open(path, encoding="utf-8") as f:
            key = f.read(MAX_API_KEY_CHARS + 2).strip()
    except OSError as err:
        raise EngineConfigError(f"--upstream-api-key-file {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise EngineConfigError(f"--upstream-api-key-file {path}: not UTF-8 text") from None
    if not key:
        raise EngineConfigError(f"--upstream-api-key-file {path}: the file is empty")
    if len(key) > MAX_API_KEY_CHARS or any(c.isspace() or not c.isprintable() for c in key):
        raise EngineConfigError(
            f"--upstream-api-key-file {path}: expected one key of at most "
            f"{MAX_API_KEY_CHARS} printable characters without spaces"
        )
    return key


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamConfig:
    """``base_url`` is the OpenAI base (``…/v1``); ``upstream_model`` picks one of the upstream's
    models (default: all it lists); ``served_model_name`` renames it for clients (needs exactly
    one model); ``max_concurrency`` bounds the streams open to the upstream at once (more wait
    here, counted as ``waiting`` in load reports); ``connect_timeout_s`` bounds connecting and
    waiting for the response headers; ``start_wait_s`` is how long ``start()`` retries
    ``GET /v1/models`` while the upstream is not up yet; ``scrape_metrics`` reads a vLLM
    upstream's ``/metrics`` for its queue and KV use."""

    base_url: str
    api_key: str | None = field(default=None, repr=False)  # never in a log line
    upstream_model: str | None = None
    served_model_name: str | None = None
    max_model_len: int | None = None
    max_concurrency: int = 256
    connect_timeout_s: float = 10.0
    start_wait_s: float = 30.0
    scrape_metrics: bool = True
    scrape_interval_s: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_url", normalize_base_url(self.base_url))
        for flag, name in (
            ("--upstream-model", self.upstream_model),
            ("--served-model-name", self.served_model_name),
        ):
            if name is not None and not 0 < len(name) <= MAX_MODEL_NAME_CHARS:
                raise EngineConfigError(f"{flag} must be 1..{MAX_MODEL_NAME_CHARS} characters")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise EngineConfigError(f"--max-model-len must be >= 1, got {self.max_model_len}")
        if not 1 <= self.max_concurrency <= 100_000:
            raise EngineConfigError(
                f"--max-num-seqs must be in [1, 100000], got {self.max_concurrency}"
            )
        if not 0 < self.connect_timeout_s <= 600:
            raise EngineConfigError(
                f"--upstream-timeout-s must be in (0, 600], got {self.connect_timeout_s}"
            )
        if not 0 <= self.start_wait_s <= 3600:
            raise EngineConfigError(
                f"--upstream-wait-s must be in [0, 3600], got {self.start_wait_s}"
            )
        if not self.scrape_interval_s > 0:
            raise EngineConfigError("scrape_interval_s must be > 0")

    @property
    def origin(self) -> str:
        """``scheme://host:port`` of the upstream (where vLLM serves ``/metrics``)."""
        parts = urlsplit(self.base_url)
        return f"{parts.scheme}://{parts.netloc}"
