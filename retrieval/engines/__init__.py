"""First-stage engines behind the index contract (:mod:`retrieval.search.view`): the local snapshot is
:mod:`retrieval.search.index`; :mod:`retrieval.engines.qdrant` runs the first stage on Qdrant."""
