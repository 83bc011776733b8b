"""The front doors onto the core: the gRPC service (thin handlers, one error mapping), API keys, clients, metrics."""
