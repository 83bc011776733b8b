"""A LlamaIndex retriever over the hybridrag gRPC service (``pip install llama-index-core``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llama_index.core.callbacks import CallbackManager
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from retrieval.api import retriever_pb2 as pb
from retrieval.client.client import ClientOptions
from retrieval.client.integrations._common import Clients, passage_id, passage_metadata

# Bookkeeping, not content: kept out of the text LlamaIndex shows an LLM or embeds (its default puts all metadata there).
_NOT_CONTENT = ["doc_id", "chunk_id", "score", "tenant", "stage_ranks", "request_id"]


class HybridRagRetriever(BaseRetriever):
    """The service as a LlamaIndex ``BaseRetriever`` (``retriever.retrieve("query")``, or under a query engine):
    one ``NodeWithScore`` per passage, in the service's order, with the final stage's score and a ``TextNode``
    whose id is ``doc_id#chunk_id``. The gRPC channel is made on first use and reused (one per event loop for
    ``aretrieve``)."""

    def __init__(self, target: str, *, api_key: str = "", top_k: int = 5, tenant: str = "",
                 filters: Mapping[str, str] | None = None, stages: Sequence[str] | None = None, timeout: float = 10.0,
                 callback_manager: CallbackManager | None = None) -> None:
        super().__init__(callback_manager=callback_manager)
        self.top_k, self.tenant, self.filters, self.stages = top_k, tenant, dict(filters or {}), list(stages or ())
        self.clients = Clients(target, ClientOptions(api_key=api_key, timeout=timeout))

    @staticmethod
    def _nodes(r: pb.RetrieveResponse) -> list[NodeWithScore]:
        return [NodeWithScore(node=TextNode(id_=passage_id(p), text=p.text, metadata=passage_metadata(p, r.request_id),
                                            excluded_llm_metadata_keys=_NOT_CONTENT,
                                            excluded_embed_metadata_keys=_NOT_CONTENT), score=p.score)
                for p in r.passages]

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        r = self.clients.sync().retrieve(query_bundle.query_str, self.top_k, tenant=self.tenant, filters=self.filters,
                                         stages=self.stages)
        return self._nodes(r)

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        r = await self.clients.aio().retrieve(query_bundle.query_str, self.top_k, tenant=self.tenant, filters=self.filters,
                                              stages=self.stages)
        return self._nodes(r)

    def close(self) -> None:
        self.clients.close()
