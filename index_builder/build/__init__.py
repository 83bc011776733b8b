"""Documents -> a snapshot: the stream, its workers, the encodings it reuses and checkpoints, and the build on a
Ray cluster. The top of ``index_builder``: only the live index (``retrieval/live``) and the command line rebuild."""
