"""A LangChain retriever over the hybridrag gRPC service (``pip install langchain-core``)."""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field, PrivateAttr, SecretStr

from retrieval.api import retriever_pb2 as pb
from retrieval.client.client import ClientOptions
from retrieval.client.integrations._common import Clients, passage_metadata


class HybridRagRetriever(BaseRetriever):
    """The service as a LangChain ``BaseRetriever``, so it drops into LCEL chains (``retriever | prompt | llm``):
    one ``Document`` per passage, in the service's order, its metadata carrying the ids, the final score and each
    stage's rank. The gRPC channel is made on first use and reused (``ainvoke`` gets one per event loop)."""

    model_config = ConfigDict(extra="forbid")  # BaseRetriever ignores unknown fields: a typo (topk=2) would pass silently

    target: str
    api_key: SecretStr = SecretStr("")
    top_k: int = 5
    tenant: str = ""
    filters: dict[str, str] = Field(default_factory=dict)
    stages: list[str] = Field(default_factory=list)
    timeout: float = 10.0
    _clients: Clients | None = PrivateAttr(default=None)

    @property
    def clients(self) -> Clients:
        if self._clients is None:
            self._clients = Clients(self.target, ClientOptions(api_key=self.api_key.get_secret_value(), timeout=self.timeout))
        return self._clients

    def _call(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "filters": self.filters, "stages": self.stages}

    @staticmethod
    def _documents(r: pb.RetrieveResponse) -> list[Document]:
        return [Document(page_content=p.text, metadata=passage_metadata(p, r.request_id)) for p in r.passages]

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return self._documents(self.clients.sync().retrieve(query, self.top_k, **self._call()))

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun) -> list[Document]:
        return self._documents(await self.clients.aio().retrieve(query, self.top_k, **self._call()))

    def close(self) -> None:
        if self._clients is not None:
            self._clients.close()
