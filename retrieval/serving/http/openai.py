"""OpenAI-compatible routes of the HTTP door, so the official ``openai`` client and every OpenAI-speaking framework
use hybridrag unchanged; and a Cohere-style ``/v1/rerank``.

- ``POST /v1/chat/completions`` (streamed and not): the last user message is the question; it is retrieved for,
  and answered from the passages by the configured generator (its system prompt, the prompt built for vLLM's prefix
  cache). The answer carries ``citations`` (the passages, numbered as in the prompt: the model cites ``[n]``) and a
  ``hybridrag`` object (request id, stats, passages). Retrieval options go in ``retrieval`` (``extra_body`` in the
  openai client): ``tenant``, ``filters``, ``top_k``, ``options``, ``bypass_cache``, as in RetrieveRequest.
  Earlier turns of the conversation are not sent to the generator; ``model`` is accepted and answered as
  ``hybridrag`` (the answering model is in ``hybridrag.stats.model``).
- ``POST /v1/embeddings``: the configured embedder (``encoding_format`` float or base64, as the client asks).
- ``GET /v1/models``: the one model, ``hybridrag``.
- ``POST /v1/rerank``: ``{"query", "documents": [str | {"text"}], "top_n", "return_documents", "stage"}`` scored by
  one reranking stage of the cascade (cross-encoder when configured, else late interaction).
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from retrieval.api import retriever_pb2 as pb
from retrieval.errors import InvalidRequest
from retrieval.serving.core import CallerGone
from retrieval.serving.http.body import read_body
from retrieval.serving.http.convert import parse_dict, parse_model, to_json
from retrieval.serving.http.door import DisconnectAwareSSE, EventFeed, HttpDoor, until_disconnect
from retrieval.serving.http.errors import error_body, error_response
from retrieval.serving.http.openapi import error_spec, model_spec

MODEL_ID = "hybridrag"


INT32_MAX = 2**31 - 1


class ChatMessage(BaseModel):
    """A message; ``content`` is a string or a list of content parts. Only ``text`` parts are read (the question is
    the last user message's text); other part types are refused rather than dropped from the question unseen.
    Other fields (``name``, ``tool_calls``, ...) are accepted and ignored."""

    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None

    @field_validator("content")
    @classmethod
    def _parts(cls, content: str | list[dict[str, Any]] | None) -> str | list[dict[str, Any]] | None:
        if isinstance(content, list):
            for i, part in enumerate(content):
                kind = part.get("type")
                if kind != "text":
                    raise ValueError(f"content[{i}]: part type {kind!r:.40} is not supported (text parts only)")
                if not isinstance(part.get("text"), str):
                    raise ValueError(f"content[{i}].text must be a string, got {type(part.get('text')).__name__}")
                if set(part) - {"type", "text"}:
                    raise ValueError(f"content[{i}]: unknown field(s) {sorted(set(part) - {'type', 'text'})[:5]}")
        return content


class ChatRequest(BaseModel):
    """The fields we act on; the other OpenAI parameters (temperature, top_p, ...) are accepted and ignored: the
    server's generation settings apply (they are part of the answer cache's key). The answer names them in
    ``hybridrag.ignored``."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str = MODEL_ID
    messages: list[ChatMessage] = Field(min_length=1, max_length=1024)
    stream: bool = False
    max_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    n: int = Field(default=1, ge=1, le=128)
    stream_options: dict[str, Any] | None = None
    retrieval: dict[str, Any] | None = None


class EmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    input: str | list[str] | list[int] | list[list[int]]
    model: str = MODEL_ID
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1, le=65536)


class RerankDocument(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    text: str


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    query: str
    documents: list[str | RerankDocument] = Field(min_length=1)
    top_n: int | None = Field(default=None, ge=1, le=INT32_MAX)
    return_documents: bool = False
    stage: str = ""
    model: str = ""


MODELS: tuple[type[BaseModel], ...] = (ChatRequest, EmbeddingsRequest, RerankRequest)


def _text(content: str | list[dict[str, Any]] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(part["text"] for part in content)


def generate_request(body: ChatRequest) -> pb.GenerateRequest:
    """The GenerateRequest of a chat request (400 for what we cannot honour)."""
    if body.n != 1:
        raise InvalidRequest(f"n must be 1 (one answer per request), got {body.n}")
    users = [m for m in body.messages if m.role == "user"]
    if not users:
        raise InvalidRequest("messages must hold a 'user' message: its text is the question")
    question = _text(users[-1].content)
    options = dict(body.retrieval or {})
    if "query" in options:
        raise InvalidRequest("retrieval.query is not allowed: the question is the last user message")
    retrieve = parse_dict(options, pb.RetrieveRequest, "retrieval")
    retrieve.query = question
    return pb.GenerateRequest(retrieve=retrieve, max_tokens=body.max_completion_tokens or body.max_tokens or 0)


def citations(passages: pb.RetrieveResponse) -> list[dict[str, Any]]:
    """The passages as the prompt numbers them (``[1]`` is the first)."""
    return [{"number": i + 1, "doc_id": p.doc_id, "title": p.title, "chunk_id": str(p.chunk_id), "score": p.score,
             "text": p.text} for i, p in enumerate(passages.passages)]


def _finish(stats: pb.GenerateStats) -> str:
    return "length" if stats.finish_reason == "length" else "stop"


def _usage(stats: pb.GenerateStats) -> dict[str, int]:
    return {"prompt_tokens": stats.tokens_in, "completion_tokens": stats.tokens_out,
            "total_tokens": stats.tokens_in + stats.tokens_out}


def add_openai_routes(app: FastAPI, door: HttpDoor) -> None:
    """The OpenAI-compatible routes and ``/v1/rerank`` (see the module docstring)."""

    @app.get("/v1/models", tags=["openai"], summary="The models (OpenAI list)", responses=error_spec())
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "hybridrag"}]}

    @app.post("/v1/chat/completions", tags=["openai"], openapi_extra=model_spec(ChatRequest), responses=error_spec(),
              summary="Retrieval-augmented chat completion (OpenAI-compatible; stream = SSE chunks)")
    async def chat(request: Request) -> Response:
        return await _chat(door, request)

    @app.post("/v1/embeddings", tags=["openai"], openapi_extra=model_spec(EmbeddingsRequest), responses=error_spec(),
              summary="Embeddings of the configured embedder (OpenAI-compatible)")
    async def embeddings(request: Request) -> Response:
        return await _embeddings(door, request)

    @app.post("/v1/rerank", tags=["openai"], openapi_extra=model_spec(RerankRequest), responses=error_spec(),
              summary="Score documents for a query with a reranking stage (Cohere-style)")
    async def rerank(request: Request) -> Response:
        return await _rerank(door, request)


class _Chat:
    """One chat completion's answer, streamed or whole, from the feed of its Generate."""

    def __init__(self, feed: EventFeed, body: ChatRequest, request_id: str, passages: pb.RetrieveResponse,
                 created: int) -> None:
        self.feed, self.body, self.request_id, self.passages, self.created = feed, body, request_id, passages, created
        self.cid = f"chatcmpl-{request_id}"
        self.cites = citations(passages)
        self.ignored = sorted(body.model_extra or {})

    def chunk(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        out = {"id": self.cid, "object": "chat.completion.chunk", "created": self.created, "model": MODEL_ID,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra}
        return f"data: {json.dumps(out, ensure_ascii=False, separators=(',', ':'))}\n\n"

    async def events(self) -> AsyncIterator[str]:
        include_usage = bool((self.body.stream_options or {}).get("include_usage"))
        try:
            yield self.chunk({"role": "assistant", "content": ""}, citations=self.cites)
            while (item := await self.feed.next()) is not None:
                if isinstance(item, BaseException):
                    yield f"data: {json.dumps(error_body(item, self.request_id)[1])}\n\n"
                    return
                kind = item.WhichOneof("event")
                if kind == "token":
                    yield self.chunk({"content": item.token})
                elif kind == "stats":
                    yield self.chunk({}, _finish(item.stats), hybridrag={
                        "request_id": self.request_id, "stats": to_json(item.stats), "ignored": self.ignored})
                    if include_usage:
                        out = {"id": self.cid, "object": "chat.completion.chunk", "created": self.created,
                               "model": MODEL_ID, "choices": [], "usage": _usage(item.stats)}
                        yield f"data: {json.dumps(out)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            await self.feed.close()

    async def collect(self) -> tuple[str, pb.GenerateStats]:
        parts: list[str] = []
        stats = pb.GenerateStats()
        while (item := await self.feed.next()) is not None:
            if isinstance(item, BaseException):
                raise item
            if item.WhichOneof("event") == "token":
                parts.append(item.token)
            elif item.WhichOneof("event") == "stats":
                stats = item.stats
        return "".join(parts), stats

    def whole(self, text: str, stats: pb.GenerateStats) -> JSONResponse:
        return JSONResponse({
            "id": self.cid, "object": "chat.completion", "created": self.created, "model": MODEL_ID,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": _finish(stats),
                         "logprobs": None}],
            "usage": _usage(stats), "citations": self.cites,
            "hybridrag": {"request_id": self.request_id, "stats": to_json(stats), "passages": to_json(self.passages),
                          "ignored": self.ignored}},
            headers={"x-request-id": self.request_id})


async def _chat(door: HttpDoor, request: Request) -> Response:
    request_id = uuid.uuid4().hex[:16]
    created = int(time.time())
    try:
        body = parse_model(await read_body(request), ChatRequest, "ChatRequest")
        feed, first = await door.start_feed(request, generate_request(body), "ChatCompletions", request_id)
    except CallerGone:
        return Response(status_code=499)
    except Exception as e:  # noqa: BLE001
        return error_response(e, request_id)
    chat = _Chat(feed, body, request_id, first.passages, created)
    if body.stream:
        return DisconnectAwareSSE(chat.events(), headers={"x-request-id": request_id, "cache-control": "no-cache"})
    try:
        text, stats = await until_disconnect(request, chat.collect())
    except CallerGone:
        return Response(status_code=499)
    except Exception as e:  # noqa: BLE001
        return error_response(e, request_id)
    finally:
        await feed.close()
    return chat.whole(text, stats)


async def _embeddings(door: HttpDoor, request: Request) -> Response:
    core = door.core

    async def work(caller: Any, request_id: str) -> tuple[np.ndarray, EmbeddingsRequest, list[str]]:
        body = parse_model(await read_body(request), EmbeddingsRequest, "EmbeddingsRequest")
        texts = [body.input] if isinstance(body.input, str) else body.input
        if any(not isinstance(t, str) for t in texts):
            raise InvalidRequest("input must be a string or a list of strings (token ids are not accepted)")
        strings = [t for t in texts if isinstance(t, str)]
        vectors = await core.embed(caller, strings)
        if body.dimensions is not None and body.dimensions != vectors.shape[1]:
            raise InvalidRequest(f"dimensions must be {vectors.shape[1]} (the embedder's), got {body.dimensions}")
        return vectors, body, strings

    return await door.unary(request, "Embeddings", work,
                            lambda result, rid: _embedding_list(result[0], result[1], result[2], core))


async def _rerank(door: HttpDoor, request: Request) -> Response:
    async def work(caller: Any, request_id: str) -> tuple[str, np.ndarray, RerankRequest, list[str]]:
        body = parse_model(await read_body(request), RerankRequest, "RerankRequest")
        texts = [d if isinstance(d, str) else d.text for d in body.documents]
        return (*await door.core.rerank(caller, body.query, texts, body.stage), body, texts)

    def answer(result: tuple[str, np.ndarray, RerankRequest, list[str]], request_id: str) -> dict[str, Any]:
        stage, scores, body, texts = result
        order = np.argsort(-scores, kind="stable")[: body.top_n or len(texts)]
        results = [{"index": int(i), "relevance_score": float(scores[i]),
                    **({"document": {"text": texts[i]}} if body.return_documents else {})} for i in order]
        return {"id": request_id, "results": results, "meta": {"stage": stage}}

    return await door.unary(request, "Rerank", work, answer)


def _embedding_list(vectors: np.ndarray, body: EmbeddingsRequest, texts: list[str], core: Any) -> dict[str, Any]:
    data = []
    for i, v in enumerate(vectors):
        if body.encoding_format == "base64":
            value: Any = base64.b64encode(np.ascontiguousarray(v, dtype="<f4").tobytes()).decode()
        else:
            value = v.astype(float).tolist()
        data.append({"object": "embedding", "index": i, "embedding": value})
    pipeline = core.state.pipeline
    tokens = sum(len(e.ids) for e in pipeline.embedder.model.tokenize(texts)) if pipeline is not None else 0
    return {"object": "list", "data": data, "model": MODEL_ID,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
