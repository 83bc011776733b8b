"""What comes in and how text is cut: corpus files (JSONL / BEIR), file readers, a folder of files as documents,
chunking, and the BM25 analysis. Imports the shared words only (``index_builder.types``, ``errors``, ``settings``)."""
