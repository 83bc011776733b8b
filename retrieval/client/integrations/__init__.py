"""Retrievers for LangChain, LlamaIndex and Haystack over the gRPC client (each module imports only its framework)."""
