"""The first stage on Qdrant, behind the same index contract as the local snapshot (:mod:`retrieval.search.view`),
one concern a file (as qdrant-client keeps its local engine in ``qdrant_client/local/``):

- :mod:`~retrieval.engines.qdrant.ids`: point ids, document numbers and the BM25 sparse vectors (the same in
  every replica, no shared state);
- :mod:`~retrieval.engines.qdrant.engine`: one collection (its layout, the migration of a snapshot, the calls);
- :mod:`~retrieval.engines.qdrant.view`: ``QdrantView``, what a request reads;
- :mod:`~retrieval.engines.qdrant.writer`: ``EngineWriter``, Upsert and Delete straight to the engine;
- :mod:`~retrieval.engines.qdrant.host`: a development host of Qdrant's local engine over its REST API;
- :mod:`~retrieval.engines.qdrant.ray_upload`: a snapshot upserted by Ray tasks in parallel.

Nothing is re-exported here: importing the host loads none of the others (no model or index code), and each
is imported from its own module.
"""
