"""The on-disk snapshot: the format and ``CURRENT``, the manifest contract a server checks, BM25 files, dense
index kinds, row files, the documents file, and the token store with its codecs. Imports ``documents``, ``models``
and the shared words; never the build."""
