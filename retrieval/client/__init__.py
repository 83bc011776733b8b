"""Clients of the hybridrag service, apart from the server: the typed gRPC clients (:mod:`retrieval.client.client`,
blocking and asyncio) and the retrievers for LangChain, LlamaIndex and Haystack over them
(:mod:`retrieval.client.integrations`, each an optional extra). Nothing here imports the server's packages.
"""

from retrieval.client.client import AsyncRetrieverClient, ClientOptions, RetrieverClient, RetryPolicy

__all__ = ["AsyncRetrieverClient", "ClientOptions", "RetrieverClient", "RetryPolicy"]
