"""A Haystack 2.x retriever component over the hybridrag gRPC service (``pip install haystack-ai``)."""

from __future__ import annotations

from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict
from haystack.utils import Secret

from retrieval.api import retriever_pb2 as pb
from retrieval.client.client import ClientOptions
from retrieval.client.integrations._common import Clients, passage_id, passage_metadata

_ENV_KEY = Secret.from_env_var("HYBRIDRAG_API_KEY", strict=False)  # unset = no key (a server without API keys)


def service_filters(filters: dict[str, Any] | None) -> dict[str, str]:
    """The service's exact-match metadata filter from Haystack's filter syntax, as far as the service can follow it
    (``==`` on ``meta.<key>``, joined by ``AND``), or from the service's own flat ``{key: value}``.

    >>> service_filters({"operator": "AND", "conditions": [{"field": "meta.source", "operator": "==", "value": "wiki"}]})
    {'source': 'wiki'}
    """
    if not filters:
        return {}
    if "operator" not in filters:
        return {str(k): str(v) for k, v in filters.items()}
    if filters["operator"] == "AND" and "conditions" in filters:
        out: dict[str, str] = {}
        for c in filters["conditions"]:
            for k, v in service_filters(c).items():
                if out.setdefault(k, v) != v:
                    raise ValueError(f"conflicting filters on {k!r}: {out[k]!r} and {v!r}")
        return out
    field = filters.get("field", "")
    if filters["operator"] == "==" and field.startswith("meta."):
        return {field.removeprefix("meta."): str(filters["value"])}
    raise ValueError(f"the service filters on metadata equality only ('==' on 'meta.<key>', joined by 'AND'), got {filters}")


@component
class HybridRagRetriever:
    """The service as a Haystack retriever component: ``{"documents": [...]}``, one ``Document`` per passage in the
    service's order (id ``doc_id#chunk_id``, the final stage's score, ids and stage ranks in ``meta``). Runtime
    ``filters`` replace the init ones (Haystack's default filter policy). The API key is a ``Secret`` (by default the
    ``HYBRIDRAG_API_KEY`` environment variable), so ``to_dict`` writes where the key comes from, never the key."""

    def __init__(self, target: str, api_key: Secret = _ENV_KEY, top_k: int = 5, tenant: str = "",
                 filters: dict[str, Any] | None = None, stages: list[str] | None = None, timeout: float = 10.0) -> None:
        self.target, self.api_key, self.top_k, self.tenant = target, api_key, top_k, tenant
        self.filters, self.stages, self.timeout = filters, stages, timeout
        self._clients: Clients | None = None

    @property
    def clients(self) -> Clients:
        if self._clients is None:  # resolved on first use: the environment may be set after the pipeline is built
            self._clients = Clients(self.target, ClientOptions(api_key=self.api_key.resolve_value() or "", timeout=self.timeout))
        return self._clients

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, target=self.target, api_key=self.api_key, top_k=self.top_k, tenant=self.tenant,
                               filters=self.filters, stages=self.stages, timeout=self.timeout)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HybridRagRetriever:
        return default_from_dict(cls, data)

    def _call(self, top_k: int | None, filters: dict[str, Any] | None) -> dict[str, Any]:
        return {"top_k": top_k or self.top_k, "tenant": self.tenant, "stages": self.stages,
                "filters": service_filters(self.filters if filters is None else filters)}

    @staticmethod
    def _documents(r: pb.RetrieveResponse) -> dict[str, list[Document]]:
        return {"documents": [Document(id=passage_id(p), content=p.text, score=p.score, meta=passage_metadata(p, r.request_id))
                              for p in r.passages]}

    @component.output_types(documents=list[Document])
    def run(self, query: str, top_k: int | None = None, filters: dict[str, Any] | None = None) -> dict[str, list[Document]]:
        return self._documents(self.clients.sync().retrieve(query, **self._call(top_k, filters)))

    @component.output_types(documents=list[Document])
    async def run_async(self, query: str, top_k: int | None = None,
                        filters: dict[str, Any] | None = None) -> dict[str, list[Document]]:
        return self._documents(await self.clients.aio().retrieve(query, **self._call(top_k, filters)))

    def close(self) -> None:
        if self._clients is not None:
            self._clients.close()
