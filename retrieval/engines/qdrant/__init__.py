"""The first stage on Qdrant (split into its rooms in the next commit)."""
