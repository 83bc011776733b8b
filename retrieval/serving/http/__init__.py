"""The HTTP door: REST + Server-Sent Events on FastAPI/uvicorn, beside gRPC, in the same process, on the same event
loop and the same core (:class:`~retrieval.serving.core.ServiceCore`: auth, tenants, admission, deadlines, the
pipeline, the semantic cache, spans and metrics).

- ``POST /v1/retrieve``, ``POST /v1/generate`` (SSE: ``passages``, ``token``..., ``stats``, ``done``),
  ``POST /v1/documents`` (upsert), ``DELETE /v1/documents``, ``GET /v1/documents``, ``POST /v1/rebuild``,
  ``GET /v1/status``: JSON bodies are the proto messages in proto3's JSON mapping; their schemas in
  ``/openapi.json`` are generated from the proto.
- OpenAI-compatible: ``/v1/chat/completions``, ``/v1/embeddings``, ``/v1/models``; Cohere-style ``/v1/rerank``.
- ``/healthz`` (the process answers), ``/readyz`` (the index and models are loaded), ``/metrics``, ``/playground``.

One file per role:

- ``app.py``: the app and its routes, uvicorn in-process (:func:`~retrieval.serving.http.app.start_http`);
- ``door.py``: the plumbing every route shares: the caller (key, ``x-timeout-ms``), one unary call through the core
  with cancellation on disconnect and deadline, a Generate streamed as SSE;
- ``convert.py``: proto <-> JSON (and the OpenAI bodies' pydantic models), every field's type checked;
- ``body.py``: the body read and loaded as bounded JSON (depth, integers, numbers, UTF-8);
- ``errors.py``: the one error mapping (our error -> gRPC code -> HTTP status) and the error shape;
- ``openapi.py``: the OpenAPI document, generated from the proto;
- ``guard.py``: the middleware before every route (Host, Origin, key, content type, body size);
- ``timeouts.py``: slow clients cut off (headers, body rate, a stalled reader) around uvicorn's protocol;
- ``openai.py``: the OpenAI-compatible routes and rerank.

Nothing is imported here: ``import retrieval.serving.http.guard`` (the engine host's) loads no routes.
"""
