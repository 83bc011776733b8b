"""Search: one request's path through the stages (request, index views, first-stage retrievers, fusion, the
pipeline with its deadlines, the micro-batchers, the semantic cache)."""
