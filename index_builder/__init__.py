"""Offline index building and the foundations the service shares with it.

The lower layer of the project: corpus readers, chunking, text analysis, the ONNX model runner and embedder,
the snapshot format (writer and verified loader) and the build pipeline. ``retrieval`` imports from here (its
live index rebuilds snapshots while serving); nothing here imports ``retrieval`` or ``rerank``.
"""
