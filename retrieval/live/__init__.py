"""The live index: the durable document store (``store.py``), the segmented write buffer (``buffer.py``), the
views a request reads over a snapshot plus the buffer (``view.py``), and the writer with its background rebuilds
and the atomic swap (``live_index.py``)."""
