"""The query-type suite (issue #53): BEIR folders whose queries carry ``metadata.type``, each type's relevant
documents derived mechanically, split into a tuning and a test half by a seeded hash of the query id.

- ``debdocs/``: a corpus read at run time from this machine's documentation (:mod:`bench.querytypes.debdocs`;
  nothing of it is stored in the repository). Types ``identifier`` (a flag, dotted or snake_case name, UPPER_CASE
  constant, version, hex id or error code found in exactly one document, asked bare), ``identifier_question``
  (the same identifiers in a question), ``phrase`` (a quoted 3-5 word phrase found verbatim in exactly one document).
- ``scifact/``, ``nfcorpus/``: the BEIR test queries (:mod:`bench.querytypes.beir`): ``natural`` (as they are),
  ``keywords`` (each query's 2-3 highest-IDF words), ``misspelled`` (seeded typos), ``long`` (the doc-query set,
  :func:`retrieval.evaluate.doc_queries`).

    python -m bench.querytypes --out results/querytypes [--seed 0]
"""
