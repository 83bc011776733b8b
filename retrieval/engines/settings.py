"""The engines' settings: ``[backend]``, which engine serves the first stage: the local snapshot (``kind = "local"``)
or a distributed engine behind the same index contract (``kind = "qdrant"``, :mod:`retrieval.engines.qdrant`).

A settings module: a dataclass and its checks only, so that loading a configuration (``retrieval/config.py``) does
not import an engine's client."""

from __future__ import annotations

import re
from dataclasses import dataclass

from index_builder.settings import Section, bounded, one_of

KINDS = ("local", "qdrant")
TOKEN_MEMORY = ("disk", "ram")
TOKEN_QUANTIZATION = ("none", "binary", "int8")
TOKEN_DATATYPES = ("float32", "float16")
_COLLECTION_RE = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")


@dataclass(frozen=True)
class EngineConfig(Section):
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

    SECTION = "backend"
    kind: str = one_of("local", KINDS)
    location: str = ":memory:"
    api_key: str = ""
    collection: str = "hybridrag"
    prefer_grpc: bool = False
    timeout_s: float = bounded(30.0, 0, open_lo=True)
    token_datatype: str = one_of("float16", TOKEN_DATATYPES)
    token_memory: str = one_of("disk", TOKEN_MEMORY)
    token_quantization: str = one_of("none", TOKEN_QUANTIZATION)
    token_rescore: bool = True
    shards: int = bounded(1, 1)
    replicas: int = bounded(1, 1)
    hnsw_ef: int = bounded(0, 0, note="0 = the collection's default")
    upload_batch: int = bounded(64, 1)

    def check(self) -> None:
        if not _COLLECTION_RE.match(self.collection):
            raise self.fail("collection", "1-64 letters, digits, '_' or '-'")

    @property
    def remote(self) -> bool:
        return self.location.startswith(("http://", "https://"))

    def describe(self) -> str:
        """For status and logs (never the key)."""
        if self.kind == "local":
            return "local snapshot"
        return f"qdrant {self.location} collection={self.collection}"
