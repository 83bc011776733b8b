"""The engines' settings: ``[backend]``, which engine serves the first stage: the local snapshot (``kind = "local"``)
or a distributed engine behind the same index contract (``kind = "qdrant"``, :mod:`retrieval.engines.qdrant`).

A settings module: a dataclass and its checks only, so that loading a configuration (``retrieval/config.py``) does
not import an engine's client."""

from __future__ import annotations

import re
from dataclasses import dataclass

KINDS = ("local", "qdrant")
TOKEN_MEMORY = ("disk", "ram")
TOKEN_QUANTIZATION = ("none", "binary", "int8")
_COLLECTION_RE = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")


@dataclass(frozen=True)
class EngineConfig:
    """``[backend]``. ``location`` (qdrant): ``":memory:"`` (the engine inside this process, empty at start: a
    snapshot given with ``--index`` is migrated into it), a folder (Qdrant's local engine persisted there; one
    process at a time), or an ``http(s)://`` URL of a Qdrant server or cluster (REST; ``prefer_grpc`` for its
    gRPC port). ``api_key``: the server's key. ``collection``: the collection of chunks (the semantic cache and
    metadata live beside it). ``token_datatype``: how a server stores the late-interaction multivectors
    (``float16`` halves their memory; local mode keeps float32); they are the vectors the snapshot's compact store
    stands for (``pool3+bins``: a third as many, decoded), written and migrated alike. ``token_memory``: ``disk``
    (default: the multivectors memory-mapped, read only for the candidates MaxSim scores, as Qdrant recommends for
    rescoring vectors without HNSW) or ``ram``. ``token_quantization``: ``none``, ``binary`` (1 bit a dimension, the
    query scored at 8 bits) or ``int8``, a copy in RAM beside the stored vectors; ``token_rescore`` (default true):
    MaxSim from the stored vectors (the snapshot's scores), else from the quantized copy only (no disk reads).
    ``shards`` / ``replicas``: for a cluster, at collection creation. ``hnsw_ef``: the dense search's ef on a
    server (0 = the collection's default). Local mode keeps these settings in the collection's config but scores
    float32 in RAM."""

    kind: str = "local"
    location: str = ":memory:"
    api_key: str = ""
    collection: str = "hybridrag"
    prefer_grpc: bool = False
    timeout_s: float = 30.0
    token_datatype: str = "float16"
    token_memory: str = "disk"
    token_quantization: str = "none"
    token_rescore: bool = True
    shards: int = 1
    replicas: int = 1
    hnsw_ef: int = 0
    upload_batch: int = 64

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not _COLLECTION_RE.match(self.collection):
            raise ValueError(f"collection must be 1-64 letters, digits, '_' or '-', got {self.collection!r}")
        if self.token_datatype not in ("float32", "float16"):
            raise ValueError(f"token_datatype must be float32 or float16, got {self.token_datatype!r}")
        if self.token_memory not in TOKEN_MEMORY:
            raise ValueError(f"token_memory must be one of {', '.join(TOKEN_MEMORY)}, got {self.token_memory!r}")
        if self.token_quantization not in TOKEN_QUANTIZATION:
            raise ValueError(f"token_quantization must be one of {', '.join(TOKEN_QUANTIZATION)}, got "
                             f"{self.token_quantization!r}")
        if self.shards < 1 or self.replicas < 1 or self.hnsw_ef < 0 or self.upload_batch < 1 or self.timeout_s <= 0:
            raise ValueError("shards, replicas and upload_batch must be >= 1, hnsw_ef >= 0 and timeout_s > 0")

    @property
    def remote(self) -> bool:
        return self.location.startswith(("http://", "https://"))

    def describe(self) -> str:
        """For status and logs (never the key)."""
        if self.kind == "local":
            return "local snapshot"
        return f"qdrant {self.location} collection={self.collection}"
