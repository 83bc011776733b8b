"""The stages of the cascade, each a small module that takes the query and hits and returns hits, runnable and
testable alone: :mod:`~retrieval.search.stages.first_stage` (BM25 + dense + RRF),
:mod:`~retrieval.search.stages.late_interaction`, :mod:`~retrieval.search.stages.cross_encoder`; what they share
about one query is :mod:`~retrieval.search.stages.query`. The pipeline (:mod:`retrieval.search.pipeline`) runs them
in order."""
