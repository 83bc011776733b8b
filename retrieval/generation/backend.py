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
from dataclasses import dataclass

import httpx

from retrieval.errors import BackendError, BackendTimeout, BackendUnavailable
from retrieval.generation.settings import BackendConfig, GenerationConfig, RoutingConfig  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)


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
