"""The lower layer, torch-free: everything a build and a server share, in four rooms over the shared words.

- ``types``, ``errors``, ``settings``: the shared words (result types, the error hierarchy, configuration sections);
- ``documents/``: corpus files, file readers, folders, chunking, analysis;
- ``models/``: the ONNX runner and every model role;
- ``snapshot/``: the on-disk format, the manifest a server checks, the token store and its codecs;
- ``build/``: documents -> a snapshot (local or on Ray).

Imports go down only: ``build`` -> ``snapshot`` -> ``documents`` / ``models`` -> shared words
(``scripts/import_graph.py``); nothing here imports another package of ours.
"""
