"""Typed Python clients for the hybridrag gRPC service (blocking and asyncio).

Each call has a deadline (``timeout`` seconds); only UNAVAILABLE is retried (the server is starting, restarting
or unreachable), with exponential backoff, because every other status is an answer: retrying a bad request,
an auth failure or RESOURCE_EXHAUSTED (overload) immediately would only add load.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from retrieval.api import retriever_pb2 as pb
from retrieval.api import retriever_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0

    def delays(self) -> list[float]:
        return [min(self.initial_backoff_s * 2**i, self.max_backoff_s) for i in range(self.attempts - 1)]


@dataclass(frozen=True)
class ClientOptions:
    api_key: str = ""
    tls_ca: str = ""  # PEM file of the CA (or the server certificate) to trust; "" = plaintext
    tls_server_name: str = ""  # override the name checked against the certificate (tests, IP targets)
    timeout: float = 10.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)


def _request(query: str, top_k: int, tenant: str, filters: Mapping[str, str] | None, stages: Sequence[str] | None,
             candidates: int, li_top_k: int, ce_top_k: int, bypass_cache: bool = False,
             highlights: bool = False) -> pb.RetrieveRequest:
    return pb.RetrieveRequest(query=query, top_k=top_k, tenant=tenant, filters=dict(filters or {}),
                              options=pb.StageOptions(stages=list(stages or ()), candidates=candidates,
                                                      li_top_k=li_top_k, ce_top_k=ce_top_k), bypass_cache=bypass_cache,
                              highlights=highlights)


def _channel_args(opts: ClientOptions) -> list[tuple[str, Any]]:
    return [("grpc.ssl_target_name_override", opts.tls_server_name)] if opts.tls_server_name else []


def _metadata(opts: ClientOptions) -> tuple[tuple[str, str], ...]:
    return (("x-api-key", opts.api_key),) if opts.api_key else ()


class RetrieverClient:
    """Blocking client: ``with RetrieverClient("localhost:50051") as c: c.retrieve("query")``."""

    def __init__(self, target: str, options: ClientOptions | None = None) -> None:
        self.options = options or ClientOptions()
        if self.options.tls_ca:
            creds = grpc.ssl_channel_credentials(Path(self.options.tls_ca).read_bytes())
            self.channel = grpc.secure_channel(target, creds, options=_channel_args(self.options))
        else:
            self.channel = grpc.insecure_channel(target)
        self.stub = pb_grpc.RetrieverStub(self.channel)

    def _call(self, method, request, timeout: float | None):
        delays = self.options.retry.delays()
        for attempt in range(len(delays) + 1):
            try:
                return method(request, timeout=timeout or self.options.timeout, metadata=_metadata(self.options))
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or attempt == len(delays):
                    raise
                time.sleep(delays[attempt])

    def retrieve(self, query: str, top_k: int = 10, *, tenant: str = "", filters: Mapping[str, str] | None = None,
                 stages: Sequence[str] | None = None, candidates: int = 0, li_top_k: int = 0, ce_top_k: int = 0,
                 bypass_cache: bool = False, highlights: bool = False,
                 timeout: float | None = None) -> pb.RetrieveResponse:
        return self._call(self.stub.Retrieve, _request(query, top_k, tenant, filters, stages, candidates, li_top_k,
                                                       ce_top_k, bypass_cache, highlights), timeout)

    def generate(self, query: str, top_k: int = 0, *, max_tokens: int = 0, tenant: str = "",
                 filters: Mapping[str, str] | None = None, stages: Sequence[str] | None = None,
                 bypass_cache: bool = False, timeout: float | None = 120.0):
        """The response stream (iterate it: passages, tokens, stats; ``.cancel()`` stops it). Not retried: a
        stream may already have delivered part of its answer."""
        request = pb.GenerateRequest(retrieve=_request(query, top_k, tenant, filters, stages, 0, 0, 0, bypass_cache),
                                     max_tokens=max_tokens)
        return self.stub.Generate(request, timeout=timeout, metadata=_metadata(self.options))

    def status(self, timeout: float | None = None) -> pb.IndexStatus:
        return self._call(self.stub.GetIndexStatus, pb.GetIndexStatusRequest(), timeout)

    def rebuild(self, timeout: float | None = 600.0) -> pb.RebuildResponse:
        return self._call(self.stub.Rebuild, pb.RebuildRequest(), timeout)

    def upsert(self, documents: Sequence[pb.Document], timeout: float | None = None) -> pb.UpsertResponse:
        return self._call(self.stub.Upsert, pb.UpsertRequest(documents=list(documents)), timeout)

    def delete(self, ids: Sequence[str], tenant: str = "", timeout: float | None = None) -> pb.DeleteResponse:
        return self._call(self.stub.Delete, pb.DeleteRequest(ids=list(ids), tenant=tenant), timeout)

    def list_documents(self, *, tenant: str = "", filters: Mapping[str, str] | None = None, after: str = "",
                       limit: int = 0, timeout: float | None = None) -> pb.ListDocumentsResponse:
        request = pb.ListDocumentsRequest(tenant=tenant, filters=dict(filters or {}), after=after, limit=limit)
        return self._call(self.stub.ListDocuments, request, timeout)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> RetrieverClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRetrieverClient:
    """asyncio client with the same methods as :class:`RetrieverClient` (awaitable)."""

    def __init__(self, target: str, options: ClientOptions | None = None) -> None:
        self.options = options or ClientOptions()
        if self.options.tls_ca:
            creds = grpc.ssl_channel_credentials(Path(self.options.tls_ca).read_bytes())
            self.channel = grpc.aio.secure_channel(target, creds, options=_channel_args(self.options))
        else:
            self.channel = grpc.aio.insecure_channel(target)
        self.stub = pb_grpc.RetrieverStub(self.channel)

    async def _call(self, method, request, timeout: float | None):
        delays = self.options.retry.delays()
        for attempt in range(len(delays) + 1):
            try:
                return await method(request, timeout=timeout or self.options.timeout, metadata=_metadata(self.options))
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or attempt == len(delays):
                    raise
                await asyncio.sleep(delays[attempt])

    async def retrieve(self, query: str, top_k: int = 10, *, tenant: str = "", filters: Mapping[str, str] | None = None,
                       stages: Sequence[str] | None = None, candidates: int = 0, li_top_k: int = 0, ce_top_k: int = 0,
                       bypass_cache: bool = False, highlights: bool = False,
                       timeout: float | None = None) -> pb.RetrieveResponse:
        return await self._call(self.stub.Retrieve, _request(query, top_k, tenant, filters, stages, candidates,
                                                             li_top_k, ce_top_k, bypass_cache, highlights), timeout)

    def generate(self, query: str, top_k: int = 0, *, max_tokens: int = 0, tenant: str = "",
                 filters: Mapping[str, str] | None = None, stages: Sequence[str] | None = None,
                 bypass_cache: bool = False, timeout: float | None = 120.0):
        """The response stream (``async for`` it; ``.cancel()`` stops it). Not retried."""
        request = pb.GenerateRequest(retrieve=_request(query, top_k, tenant, filters, stages, 0, 0, 0, bypass_cache),
                                     max_tokens=max_tokens)
        return self.stub.Generate(request, timeout=timeout, metadata=_metadata(self.options))

    async def status(self, timeout: float | None = None) -> pb.IndexStatus:
        return await self._call(self.stub.GetIndexStatus, pb.GetIndexStatusRequest(), timeout)

    async def rebuild(self, timeout: float | None = 600.0) -> pb.RebuildResponse:
        return await self._call(self.stub.Rebuild, pb.RebuildRequest(), timeout)

    async def upsert(self, documents: Sequence[pb.Document], timeout: float | None = None) -> pb.UpsertResponse:
        return await self._call(self.stub.Upsert, pb.UpsertRequest(documents=list(documents)), timeout)

    async def delete(self, ids: Sequence[str], tenant: str = "", timeout: float | None = None) -> pb.DeleteResponse:
        return await self._call(self.stub.Delete, pb.DeleteRequest(ids=list(ids), tenant=tenant), timeout)

    async def list_documents(self, *, tenant: str = "", filters: Mapping[str, str] | None = None, after: str = "",
                             limit: int = 0, timeout: float | None = None) -> pb.ListDocumentsResponse:
        request = pb.ListDocumentsRequest(tenant=tenant, filters=dict(filters or {}), after=after, limit=limit)
        return await self._call(self.stub.ListDocuments, request, timeout)

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> AsyncRetrieverClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
