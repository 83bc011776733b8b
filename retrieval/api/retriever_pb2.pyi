from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StageOptions(_message.Message):
    __slots__ = ("stages", "candidates", "li_top_k", "ce_top_k")
    STAGES_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    LI_TOP_K_FIELD_NUMBER: _ClassVar[int]
    CE_TOP_K_FIELD_NUMBER: _ClassVar[int]
    stages: _containers.RepeatedScalarFieldContainer[str]
    candidates: int
    li_top_k: int
    ce_top_k: int
    def __init__(self, stages: _Optional[_Iterable[str]] = ..., candidates: _Optional[int] = ..., li_top_k: _Optional[int] = ..., ce_top_k: _Optional[int] = ...) -> None: ...

class RetrieveRequest(_message.Message):
    __slots__ = ("query", "top_k", "tenant", "filters", "options", "bypass_cache", "highlights")
    class FiltersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    QUERY_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    FILTERS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    BYPASS_CACHE_FIELD_NUMBER: _ClassVar[int]
    HIGHLIGHTS_FIELD_NUMBER: _ClassVar[int]
    query: str
    top_k: int
    tenant: str
    filters: _containers.ScalarMap[str, str]
    options: StageOptions
    bypass_cache: bool
    highlights: bool
    def __init__(self, query: _Optional[str] = ..., top_k: _Optional[int] = ..., tenant: _Optional[str] = ..., filters: _Optional[_Mapping[str, str]] = ..., options: _Optional[_Union[StageOptions, _Mapping]] = ..., bypass_cache: _Optional[bool] = ..., highlights: _Optional[bool] = ...) -> None: ...

class StageScore(_message.Message):
    __slots__ = ("stage", "rank", "score")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    stage: str
    rank: int
    score: float
    def __init__(self, stage: _Optional[str] = ..., rank: _Optional[int] = ..., score: _Optional[float] = ...) -> None: ...

class Passage(_message.Message):
    __slots__ = ("doc_id", "chunk_id", "title", "text", "score", "stages", "tenant", "metadata", "highlights", "truncated", "text_chars")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    HIGHLIGHTS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    TEXT_CHARS_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    chunk_id: int
    title: str
    text: str
    score: float
    stages: _containers.RepeatedCompositeFieldContainer[StageScore]
    tenant: str
    metadata: _containers.ScalarMap[str, str]
    highlights: _containers.RepeatedCompositeFieldContainer[Highlight]
    truncated: bool
    text_chars: int
    def __init__(self, doc_id: _Optional[str] = ..., chunk_id: _Optional[int] = ..., title: _Optional[str] = ..., text: _Optional[str] = ..., score: _Optional[float] = ..., stages: _Optional[_Iterable[_Union[StageScore, _Mapping]]] = ..., tenant: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., highlights: _Optional[_Iterable[_Union[Highlight, _Mapping]]] = ..., truncated: _Optional[bool] = ..., text_chars: _Optional[int] = ...) -> None: ...

class Highlight(_message.Message):
    __slots__ = ("start", "end", "text", "score")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    text: str
    score: float
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ..., text: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class SkippedStage(_message.Message):
    __slots__ = ("stage", "reason")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    stage: str
    reason: str
    def __init__(self, stage: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RetrieveResponse(_message.Message):
    __slots__ = ("passages", "timings_ms", "stages_run", "skipped", "degraded", "index_generation", "request_id", "cache_hit", "cache_similarity")
    class TimingsMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    PASSAGES_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_MS_FIELD_NUMBER: _ClassVar[int]
    STAGES_RUN_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    INDEX_GENERATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_FIELD_NUMBER: _ClassVar[int]
    CACHE_SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    passages: _containers.RepeatedCompositeFieldContainer[Passage]
    timings_ms: _containers.ScalarMap[str, float]
    stages_run: _containers.RepeatedScalarFieldContainer[str]
    skipped: _containers.RepeatedCompositeFieldContainer[SkippedStage]
    degraded: bool
    index_generation: int
    request_id: str
    cache_hit: bool
    cache_similarity: float
    def __init__(self, passages: _Optional[_Iterable[_Union[Passage, _Mapping]]] = ..., timings_ms: _Optional[_Mapping[str, float]] = ..., stages_run: _Optional[_Iterable[str]] = ..., skipped: _Optional[_Iterable[_Union[SkippedStage, _Mapping]]] = ..., degraded: _Optional[bool] = ..., index_generation: _Optional[int] = ..., request_id: _Optional[str] = ..., cache_hit: _Optional[bool] = ..., cache_similarity: _Optional[float] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("retrieve", "max_tokens")
    RETRIEVE_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    retrieve: RetrieveRequest
    max_tokens: int
    def __init__(self, retrieve: _Optional[_Union[RetrieveRequest, _Mapping]] = ..., max_tokens: _Optional[int] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("passages", "token", "stats")
    PASSAGES_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    passages: RetrieveResponse
    token: str
    stats: GenerateStats
    def __init__(self, passages: _Optional[_Union[RetrieveResponse, _Mapping]] = ..., token: _Optional[str] = ..., stats: _Optional[_Union[GenerateStats, _Mapping]] = ...) -> None: ...

class GenerateStats(_message.Message):
    __slots__ = ("retrieval_ms", "time_to_first_token_ms", "generation_ms", "tokens_in", "tokens_out", "model", "cache_hit", "route", "passages_in_prompt", "context_truncated", "finish_reason")
    RETRIEVAL_MS_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_MS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_IN_FIELD_NUMBER: _ClassVar[int]
    TOKENS_OUT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    PASSAGES_IN_PROMPT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    retrieval_ms: float
    time_to_first_token_ms: float
    generation_ms: float
    tokens_in: int
    tokens_out: int
    model: str
    cache_hit: bool
    route: str
    passages_in_prompt: int
    context_truncated: bool
    finish_reason: str
    def __init__(self, retrieval_ms: _Optional[float] = ..., time_to_first_token_ms: _Optional[float] = ..., generation_ms: _Optional[float] = ..., tokens_in: _Optional[int] = ..., tokens_out: _Optional[int] = ..., model: _Optional[str] = ..., cache_hit: _Optional[bool] = ..., route: _Optional[str] = ..., passages_in_prompt: _Optional[int] = ..., context_truncated: _Optional[bool] = ..., finish_reason: _Optional[str] = ...) -> None: ...

class Document(_message.Message):
    __slots__ = ("id", "title", "text", "tenant", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    id: str
    title: str
    text: str
    tenant: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., title: _Optional[str] = ..., text: _Optional[str] = ..., tenant: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class UpsertRequest(_message.Message):
    __slots__ = ("documents",)
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    documents: _containers.RepeatedCompositeFieldContainer[Document]
    def __init__(self, documents: _Optional[_Iterable[_Union[Document, _Mapping]]] = ...) -> None: ...

class UpsertResponse(_message.Message):
    __slots__ = ("sequence", "upserted")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    UPSERTED_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    upserted: int
    def __init__(self, sequence: _Optional[int] = ..., upserted: _Optional[int] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("ids", "tenant")
    IDS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    tenant: str
    def __init__(self, ids: _Optional[_Iterable[str]] = ..., tenant: _Optional[str] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("sequence", "deleted")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    deleted: int
    def __init__(self, sequence: _Optional[int] = ..., deleted: _Optional[int] = ...) -> None: ...

class ListDocumentsRequest(_message.Message):
    __slots__ = ("tenant", "filters", "after", "limit")
    class FiltersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TENANT_FIELD_NUMBER: _ClassVar[int]
    FILTERS_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    filters: _containers.ScalarMap[str, str]
    after: str
    limit: int
    def __init__(self, tenant: _Optional[str] = ..., filters: _Optional[_Mapping[str, str]] = ..., after: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class DocumentInfo(_message.Message):
    __slots__ = ("id", "tenant", "title", "metadata", "sequence")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant: str
    title: str
    metadata: _containers.ScalarMap[str, str]
    sequence: int
    def __init__(self, id: _Optional[str] = ..., tenant: _Optional[str] = ..., title: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., sequence: _Optional[int] = ...) -> None: ...

class ListDocumentsResponse(_message.Message):
    __slots__ = ("documents", "next_after")
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_AFTER_FIELD_NUMBER: _ClassVar[int]
    documents: _containers.RepeatedCompositeFieldContainer[DocumentInfo]
    next_after: str
    def __init__(self, documents: _Optional[_Iterable[_Union[DocumentInfo, _Mapping]]] = ..., next_after: _Optional[str] = ...) -> None: ...

class RebuildRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RebuildResponse(_message.Message):
    __slots__ = ("generation", "covered_sequence", "seconds", "still_buffered")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    COVERED_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    STILL_BUFFERED_FIELD_NUMBER: _ClassVar[int]
    generation: int
    covered_sequence: int
    seconds: float
    still_buffered: int
    def __init__(self, generation: _Optional[int] = ..., covered_sequence: _Optional[int] = ..., seconds: _Optional[float] = ..., still_buffered: _Optional[int] = ...) -> None: ...

class GetIndexStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class IndexStatus(_message.Message):
    __slots__ = ("generation", "documents", "chunks", "buffered_writes", "last_rebuild", "models", "dense_available", "dense_error", "late_interaction_available", "snapshot_path", "cache", "generation_backend", "backend")
    class ModelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class CacheEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_WRITES_FIELD_NUMBER: _ClassVar[int]
    LAST_REBUILD_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    DENSE_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    DENSE_ERROR_FIELD_NUMBER: _ClassVar[int]
    LATE_INTERACTION_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_PATH_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_BACKEND_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    generation: int
    documents: int
    chunks: int
    buffered_writes: int
    last_rebuild: str
    models: _containers.ScalarMap[str, str]
    dense_available: bool
    dense_error: str
    late_interaction_available: bool
    snapshot_path: str
    cache: _containers.ScalarMap[str, float]
    generation_backend: str
    backend: str
    def __init__(self, generation: _Optional[int] = ..., documents: _Optional[int] = ..., chunks: _Optional[int] = ..., buffered_writes: _Optional[int] = ..., last_rebuild: _Optional[str] = ..., models: _Optional[_Mapping[str, str]] = ..., dense_available: _Optional[bool] = ..., dense_error: _Optional[str] = ..., late_interaction_available: _Optional[bool] = ..., snapshot_path: _Optional[str] = ..., cache: _Optional[_Mapping[str, float]] = ..., generation_backend: _Optional[str] = ..., backend: _Optional[str] = ...) -> None: ...
