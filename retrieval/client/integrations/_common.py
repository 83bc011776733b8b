"""What the three adapters share: their clients, made lazily and reused, and a passage's metadata."""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Any

from retrieval.api import retriever_pb2 as pb
from retrieval.client.client import AsyncRetrieverClient, ClientOptions, RetrieverClient


class Clients:
    """One blocking client, and one asyncio client per event loop: a grpc.aio channel is bound to the loop it was
    made on, so reusing it under a second ``asyncio.run`` fails with "Event loop is closed"."""

    def __init__(self, target: str, options: ClientOptions) -> None:
        self.target, self.options = target, options
        self._sync: RetrieverClient | None = None
        self._aio: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncRetrieverClient] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def sync(self) -> RetrieverClient:
        with self._lock:
            if self._sync is None:
                self._sync = RetrieverClient(self.target, self.options)
            return self._sync

    def aio(self) -> AsyncRetrieverClient:
        loop = asyncio.get_running_loop()
        with self._lock:
            if loop not in self._aio:
                self._aio[loop] = AsyncRetrieverClient(self.target, self.options)
            return self._aio[loop]

    def close(self) -> None:
        """Closes the blocking channel; asyncio channels go with their loop (``aclose`` closes the current one's)."""
        with self._lock:
            if self._sync is not None:
                self._sync.close()
                self._sync = None

    async def aclose(self) -> None:
        with self._lock:
            client = self._aio.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()


def passage_id(p: pb.Passage) -> str:
    return f"{p.doc_id}#{p.chunk_id}"


def passage_metadata(p: pb.Passage, request_id: str) -> dict[str, Any]:
    """The document's own metadata, then ours (so a document's metadata can't pass for a score or an id)."""
    return {**p.metadata, "doc_id": p.doc_id, "chunk_id": int(p.chunk_id), "title": p.title, "score": p.score,
            "tenant": p.tenant, "stage_ranks": {s.stage: s.rank for s in p.stages}, "request_id": request_id}
