"""Generation backends: one OpenAI-compatible chat-completions client with streaming (SSE), the same code for vLLM
(``vllm serve MODEL --enable-prefix-caching``) and llama.cpp's server (the embedded default, see
:mod:`retrieval.generation.embedded`), plus the optional small/large model routing rule.

The client is async (httpx) and runs on the gRPC server's event loop: waiting for tokens costs the loop nothing.
Closing the iterator (the gRPC call was cancelled or its deadline passed) closes the HTTP response at once, which
vLLM and llama.cpp take as an abort. Errors: cannot connect, 5xx or 429 -> :class:`BackendUnavailable`; no bytes
within the read timeout -> :class:`BackendTimeout`; another non-200 -> :class:`BackendError`; each names the backend.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import httpx

from retrieval.errors import BackendError, BackendTimeout, BackendUnavailable
from retrieval.generation.embedded import EmbeddedLLMConfig
from retrieval.generation.prompt import DEFAULT_SYSTEM_PROMPT

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackendConfig:
    """One OpenAI-compatible server. ``base_url`` is the API root (``http://host:8000/v1``); empty = the embedded
    llama.cpp server. ``api_key``: set it from the environment (``HYBRIDRAG_GENERATION__BACKEND__API_KEY``), never
    in a committed file. Timeouts: ``connect_timeout_s`` to open the connection, ``read_timeout_s`` between two
    chunks of the stream (the first one included: the prompt is processed before it)."""

    base_url: str = ""
    model: str = ""
    api_key: str = ""
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ValueError("backend timeouts must be > 0")
        if self.base_url and not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"backend base_url must start with http:// or https://, got {self.base_url!r}")


@dataclass(frozen=True)
class RoutingConfig:
    """Off by default. When on, a question of at most ``max_words`` words with none of ``complex_words`` goes to
    ``small``, everything else to ``large``; the response names the model that answered."""

    enabled: bool = False
    small: BackendConfig = field(default_factory=BackendConfig)
    large: BackendConfig = field(default_factory=BackendConfig)
    max_words: int = 12
    complex_words: tuple[str, ...] = ("why", "how", "explain", "compare", "difference", "versus", "vs", "mechanism",
                                      "relationship", "evidence")

    def __post_init__(self) -> None:
        if self.max_words < 1:
            raise ValueError("routing.max_words must be >= 1")


@dataclass(frozen=True)
class GenerationConfig:
    """``max_tokens``: answer length when the request gives none; ``max_tokens_limit``: the most a request may ask.
    ``context_tokens``: the token budget of the context passages in the prompt; ``passages``: how many retrieved
    passages Generate asks for when the request's ``top_k`` is 0. ``tokenizer``: the generator's tokenizer for the
    budget (a .gguf or tokenizer.json); empty = the embedded model's GGUF when it serves, else an estimate.
    ``cache_answers``: keep finished answers in the semantic cache (when the cache is on).
    ``max_question_tokens``: the question's share of the prompt; a longer question (a whole passage as the query)
    is cut to it, so the prompt stays within the model's context (the cut is reported as ``question_truncated``)."""

    backend: BackendConfig = field(default_factory=BackendConfig)
    embedded: EmbeddedLLMConfig = field(default_factory=EmbeddedLLMConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    max_tokens: int = 256
    max_tokens_limit: int = 1024
    temperature: float = 0.0
    stop: tuple[str, ...] = ()
    context_tokens: int = 1536
    max_question_tokens: int = 512
    passages: int = 5
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    tokenizer: str = ""
    cache_answers: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.max_tokens <= self.max_tokens_limit:
            raise ValueError(f"generation needs 1 <= max_tokens <= max_tokens_limit, got {self.max_tokens}, "
                             f"{self.max_tokens_limit}")
        if self.context_tokens < 64 or self.passages < 1 or not 0.0 <= self.temperature <= 2.0:
            raise ValueError("generation needs context_tokens >= 64, passages >= 1 and 0 <= temperature <= 2")
        if self.max_question_tokens < 16:
            raise ValueError(f"generation needs max_question_tokens >= 16, got {self.max_question_tokens}")


def route(question: str, config: RoutingConfig) -> str:
    """``"small"`` or ``"large"`` by the configured rule.

    >>> route("What is BRCA1?", RoutingConfig(enabled=True))
    'small'
    >>> route("Why does vitamin D deficiency raise the risk of fractures?", RoutingConfig(enabled=True))
    'large'
    """
    words = re.findall(r"[\w'-]+", question.lower())
    if len(words) > config.max_words or any(w in config.complex_words for w in words):
        return "large"
    return "small"


@dataclass
class StreamEvent:
    """A text delta, or (last) the usage and finish reason when the server reports them."""

    text: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None


class ChatBackend:
    """Streams chat completions from one OpenAI-compatible server."""

    def __init__(self, config: BackendConfig, *, base_url: str | None = None, model: str | None = None,
                 label: str = "") -> None:
        self.config = config
        self.base_url = (base_url or config.base_url).rstrip("/")
        self.model = model or config.model
        self.label = label or self.base_url
        self.open_streams = 0  # HTTP streams open right now (tests check cancellation closes them)
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:  # created on first use, on the loop that uses it
            headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
            self._client = httpx.AsyncClient(headers=headers, limits=httpx.Limits(max_connections=256))
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def stream(self, messages: Sequence[dict[str, str]], *, max_tokens: int, temperature: float = 0.0,
                     stop: Sequence[str] = (), deadline: float | None = None) -> AsyncIterator[StreamEvent]:
        """Yield the answer's text deltas as the server produces them, then one event with usage (if reported).

        ``deadline`` (``time.monotonic()`` seconds) caps the read timeout, so a call never waits past its deadline.
        """
        url = f"{self.base_url}/chat/completions"
        read = self.config.read_timeout_s
        if deadline is not None:
            read = max(0.001, min(read, deadline - time.monotonic()))
        timeout = httpx.Timeout(connect=self.config.connect_timeout_s, read=read, write=read, pool=read)
        payload = {"model": self.model, "messages": list(messages), "max_tokens": max_tokens,
                   "temperature": temperature, "stream": True, "stream_options": {"include_usage": True}}
        if stop:
            payload["stop"] = list(stop)
        last = StreamEvent()
        self.open_streams += 1
        try:
            async with self._http().stream("POST", url, json=payload, timeout=timeout) as resp:
                if resp.status_code != 200:
                    body = (await resp.aread()).decode("utf-8", errors="replace")[:300]
                    msg = f"generation backend {self.label} answered HTTP {resp.status_code}: {body}"
                    raise (BackendUnavailable if resp.status_code >= 500 or resp.status_code == 429 else BackendError)(msg)
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    try:
                        chunk = json.loads(data)
                    except json.JSONDecodeError:
                        raise BackendError(f"generation backend {self.label} sent a malformed event: {data[:200]!r}") from None
                    if usage := chunk.get("usage"):
                        last.prompt_tokens = usage.get("prompt_tokens")
                        last.completion_tokens = usage.get("completion_tokens")
                    for choice in chunk.get("choices") or ():
                        if choice.get("finish_reason"):
                            last.finish_reason = choice["finish_reason"]
                        text = (choice.get("delta") or {}).get("content")
                        if text:
                            yield StreamEvent(text=text)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            raise BackendUnavailable(f"generation backend {self.label} is unreachable: {e or type(e).__name__}") from None
        except httpx.ReadTimeout:
            raise BackendTimeout(f"generation backend {self.label} sent nothing for {read:.3g} s") from None
        except (httpx.RemoteProtocolError, httpx.ReadError) as e:
            raise BackendUnavailable(f"generation backend {self.label} broke off the stream: {e or type(e).__name__}") from None
        finally:
            self.open_streams -= 1
        yield last
