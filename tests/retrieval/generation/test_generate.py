"""Generate end to end: a real llama.cpp OpenAI-compatible server (llama-cpp-python with the bundled
SmolLM2-135M-Instruct GGUF) on a free port, the sample index, a real gRPC server on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
import urllib.request
from pathlib import Path

import grpc
import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from retrieval.api import retriever_pb2 as pb
from retrieval.client import ClientOptions, RetrieverClient, RetryPolicy
from retrieval.config import ServerConfig
from retrieval.generation.backend import BackendConfig, GenerationConfig, RoutingConfig
from retrieval.generation.embedded import EmbeddedLLMConfig, EmbeddedLLMServer, bundled_gguf, free_port
from retrieval.generation.generator import GeneratorSetup, open_generator
from retrieval.generation.prompt import ContextPassage, build_prompt, make_counter
from retrieval.observability.tracing import TracingConfig, make_tracing
from retrieval.search.pipeline import Pipeline
from retrieval.search.semantic_cache import SemanticCache
from retrieval.serving.server import BackgroundServer
from retrieval.serving.settings import HttpConfig
from tests.helpers import ServeProcess

pytestmark = pytest.mark.slow  # a real llama.cpp server generates for every test here
QUESTION = "Why do noodles take longer to boil at high elevation?"
NO_RETRY = ClientOptions(retry=RetryPolicy(attempts=1), timeout=120)


@pytest.fixture(scope="module")
def llm():
    with EmbeddedLLMServer(EmbeddedLLMConfig(threads=2, nice=0, n_ctx=2048)) as server:
        yield server


@pytest.fixture(scope="module")
def gguf_counter():
    return make_counter(bundled_gguf())


@pytest.fixture(scope="module")
def spans():
    """The spans of this module's server and pipeline (an in-memory exporter)."""
    exporter = InMemorySpanExporter()
    tracing = make_tracing(TracingConfig(), exporter=exporter)
    yield tracing.tracer, exporter
    tracing.shutdown()


@pytest.fixture(scope="module")
def gen_pipeline(sample_index, embedder, config, spans):
    p = Pipeline(sample_index, embedder, config, cache=SemanticCache(config.cache), tracer=spans[0])
    yield p
    p.close()


def _setup(pipeline: Pipeline, backend: BackendConfig, **over) -> GeneratorSetup:
    config = GenerationConfig(backend=backend, max_tokens=24, tokenizer=str(bundled_gguf()), **over)
    return open_generator(pipeline, config, pipeline.cache)


@pytest.fixture(scope="module")
def server(gen_pipeline, llm, spans):
    setup = _setup(gen_pipeline, BackendConfig(base_url=llm.base_url, model="smollm2"))
    s = BackgroundServer(gen_pipeline, ServerConfig(port=0), generation=setup, tracer=spans[0],
                         http=HttpConfig(port=0))  # the HTTP door's tests below use it too
    yield s
    s.stop()


def _stream(call) -> tuple[list[pb.GenerateResponse], grpc.RpcError | None]:
    out = []
    try:
        for msg in call:
            out.append(msg)
    except grpc.RpcError as e:
        return out, e
    return out, None


def _established_to(port: int) -> int:
    """Open TCP connections to ``port`` on loopback, from the kernel's table (client side: remote port = ``port``)."""
    n = 0
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        local, remote, state = line.split()[1:4]
        if state == "01" and int(remote.split(":")[1], 16) == port:
            n += 1
    return n


def test_prompt_puts_the_fixed_part_first_and_cuts_at_token_boundaries(gguf_counter):
    passages = [ContextPassage(f"d{i}", f"Title {i}", " ".join([f"passage {i} sentence about boiling water."] * 12))
                for i in range(1, 6)]
    full = build_prompt(QUESTION, passages, counter=gguf_counter, budget_tokens=4000, system_prompt="SYSTEM")
    assert full.messages[0] == {"role": "system", "content": "SYSTEM"}
    user = full.messages[1]["content"]
    assert user.startswith("Context:\n\n[1] (doc d1) Title 1\n") and user.endswith(f"Question: {QUESTION}")
    assert [int(n) for n in re.findall(r"^\[(\d)\]", user, re.M)] == [1, 2, 3, 4, 5] and not full.truncated
    assert build_prompt(QUESTION, passages, counter=gguf_counter, budget_tokens=4000, system_prompt="SYSTEM") == full
    one = gguf_counter.count(user.split("\n\n")[1])
    tight = build_prompt(QUESTION, passages, counter=gguf_counter, budget_tokens=2 * one + 40, system_prompt="SYSTEM")
    assert tight.passages_used == 3 and tight.truncated and tight.context_tokens <= 2 * one + 40
    blocks = tight.messages[1]["content"].split("\n\n")[1:-1]
    assert "[4]" not in tight.messages[1]["content"]  # lower-ranked passages are dropped, not cut
    cut = blocks[2]
    third = "[3] (doc d3) Title 3\n" + passages[2].text
    assert third.startswith(cut) and cut != third
    ids = gguf_counter._ids(third)  # the cut is exactly a prefix of whole tokens
    assert gguf_counter._ids(cut) == ids[:len(gguf_counter._ids(cut))]


def test_generate_streams_passages_then_tokens_then_stats(server, gen_pipeline, spans):
    spans[1].clear()
    with RetrieverClient(server.target, NO_RETRY) as c:
        msgs, err = _stream(c.generate(QUESTION, 3, max_tokens=24, bypass_cache=True))
        retrieved = c.retrieve(QUESTION, 3, bypass_cache=True)
    assert err is None
    kinds = [m.WhichOneof("event") for m in msgs]
    assert kinds[0] == "passages" and kinds[-1] == "stats" and set(kinds[1:-1]) == {"token"} and len(kinds) >= 3
    assert [p.doc_id for p in msgs[0].passages.passages] == [p.doc_id for p in retrieved.passages]
    answer = "".join(m.token for m in msgs[1:-1])
    assert answer.strip()
    s = msgs[-1].stats
    assert s.model == "smollm2" and s.route == "default" and not s.cache_hit and s.passages_in_prompt == 3
    assert 0 < s.tokens_out <= 24 and s.tokens_in > 50 and s.finish_reason in ("stop", "length")
    assert 0 < s.time_to_first_token_ms <= s.generation_ms and s.retrieval_ms > 0
    # The trace: Generate > (search > stages), llm; the metrics: one generation observed.
    finished = spans[1].get_finished_spans()
    (root,) = [sp for sp in finished if sp.name == "hybridrag.Generate"]
    (llm,) = [sp for sp in finished if sp.name == "hybridrag.llm"]
    search = next(sp for sp in finished if sp.name == "hybridrag.search" and sp.parent.span_id == root.context.span_id)
    assert llm.parent.span_id == root.context.span_id and llm.start_time >= search.end_time
    assert llm.attributes["gen_ai.usage.output_tokens"] == s.tokens_out and llm.attributes["gen_ai.request.model"] == "smollm2"
    assert root.attributes["hybridrag.request_id"] == msgs[0].passages.request_id
    metric = server.running.state.metrics.registry.get_sample_value
    assert metric("hybridrag_generate_first_token_seconds_count") >= 1
    assert metric("hybridrag_requests_total", {"method": "Generate", "code": "OK", "transport": "grpc"}) >= 1


def test_the_answer_cache_serves_a_repeat_and_a_paraphrase(server):
    with RetrieverClient(server.target, NO_RETRY) as c:
        first, _ = _stream(c.generate("How far does light travel in one year?", 3, max_tokens=16))
        again, _ = _stream(c.generate("How far does light go in a year?", 3, max_tokens=16))
        other, _ = _stream(c.generate("How far does light travel in one second?", 3, max_tokens=16))
        status = c.status()
    assert not first[-1].stats.cache_hit and again[-1].stats.cache_hit and not other[-1].stats.cache_hit
    assert "".join(m.token for m in again[1:-1]) == "".join(m.token for m in first[1:-1])
    assert again[0].passages.cache_hit and again[-1].stats.tokens_out == first[-1].stats.tokens_out
    assert status.cache["hits"] >= 2 and "smollm2" in status.generation_backend


def test_cancelling_the_call_closes_the_backend_stream(server, llm):
    backend = server.running.state.generation.generator.backends["default"]
    with RetrieverClient(server.target, NO_RETRY) as c:
        call = c.generate("Explain in detail how a pressure cooker works.", 3, max_tokens=1000, bypass_cache=True)
        first = [next(call), next(call)]
        assert first[1].WhichOneof("event") == "token"
        assert backend.open_streams == 1
        during = _established_to(llm.port)
        call.cancel()
        t = time.monotonic()
        while (backend.open_streams or _established_to(llm.port) >= during) and time.monotonic() - t < 5:
            time.sleep(0.02)
        assert backend.open_streams == 0 and _established_to(llm.port) == during - 1
        assert time.monotonic() - t < 5
        # the backend is free again: a new answer streams at once (a 1000-token answer would still be running)
        msgs, err = _stream(c.generate(QUESTION, 2, max_tokens=8, bypass_cache=True))
        assert err is None and msgs[-1].stats.tokens_out > 0
        # the call's deadline passing while the backend works (here: on the prompt, ~2 s for 2 passages) closes
        # the backend stream the same way
        msgs, err = _stream(c.generate("Explain in detail how a pressure cooker works.", 2, max_tokens=1000,
                                       bypass_cache=True, timeout=1.0))
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED and msgs[0].WhichOneof("event") == "passages"
        t = time.monotonic()
        while backend.open_streams and time.monotonic() - t < 5:
            time.sleep(0.02)
        assert backend.open_streams == 0 and _established_to(llm.port) <= during - 1


def test_backend_down_is_unavailable_after_the_passages(gen_pipeline):
    url = f"http://127.0.0.1:{free_port()}/v1"
    setup = _setup(gen_pipeline, BackendConfig(base_url=url))
    with BackgroundServer(gen_pipeline, ServerConfig(port=0), generation=setup) as s, RetrieverClient(s.target, NO_RETRY) as c:
        msgs, err = _stream(c.generate(QUESTION, 3, bypass_cache=True))
    assert [m.WhichOneof("event") for m in msgs] == ["passages"] and len(msgs[0].passages.passages) == 3
    assert err is not None and err.code() == grpc.StatusCode.UNAVAILABLE and url in err.details()


def test_backend_timeout_is_deadline_exceeded_and_bad_max_tokens_is_invalid(gen_pipeline, llm):
    slow = BackendConfig(base_url=llm.base_url, model="smollm2", read_timeout_s=0.001)
    with BackgroundServer(gen_pipeline, ServerConfig(port=0), generation=_setup(gen_pipeline, slow)) as s, \
            RetrieverClient(s.target, NO_RETRY) as c:
        msgs, err = _stream(c.generate(QUESTION, 3, bypass_cache=True))
        assert [m.WhichOneof("event") for m in msgs] == ["passages"]
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED and llm.base_url in err.details()
        for bad in (-1, 5000):
            msgs, err = _stream(c.generate(QUESTION, 3, max_tokens=bad))
            assert msgs == [] and err.code() == grpc.StatusCode.INVALID_ARGUMENT and "max_tokens" in err.details()


def test_routing_sends_short_questions_to_the_small_model(gen_pipeline, llm):
    routing = RoutingConfig(enabled=True, small=BackendConfig(base_url=llm.base_url, model="tiny"),
                            large=BackendConfig(base_url=llm.base_url, model="big"))
    with BackgroundServer(gen_pipeline, ServerConfig(port=0), generation=_setup(gen_pipeline, BackendConfig(),
                                                                                 routing=routing)) as s, \
            RetrieverClient(s.target, NO_RETRY) as c:
        short, _ = _stream(c.generate("What is a light year?", 2, max_tokens=8, bypass_cache=True))
        long, _ = _stream(c.generate(QUESTION, 2, max_tokens=8, bypass_cache=True))
    assert (short[-1].stats.route, short[-1].stats.model) == ("small", "tiny")
    assert (long[-1].stats.route, long[-1].stats.model) == ("large", "big")


def _serve(index_dir) -> ServeProcess:
    """``hybridrag serve`` on free ports, with the embedded generator (no backend configured)."""
    return ServeProcess(["--index", str(index_dir)])


def test_serve_answers_generate_with_the_embedded_default(sample_index_dir):
    """``hybridrag serve`` with no backend configured starts its own llama.cpp server and answers Generate."""
    server = _serve(sample_index_dir)
    proc = server.proc
    try:
        port = server.port
        with RetrieverClient(f"127.0.0.1:{port}", NO_RETRY) as c:
            msgs, err = _stream(c.generate(QUESTION, 3, max_tokens=16))
            assert "embedded llama.cpp" in c.status().generation_backend
        assert err is None, err
        assert msgs[0].passages.passages and "".join(m.token for m in msgs[1:-1]).strip()
        assert msgs[-1].stats.model == "smollm2-135m-instruct" and msgs[-1].stats.tokens_out > 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def _answers(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/models", timeout=2.0) as r:
            return r.status == 200
    except OSError:
        return False


def test_embedded_server_dies_with_a_killed_parent(sample_index_dir):
    """SIGKILL of ``hybridrag serve`` (no shutdown code runs) still takes its llama.cpp server down: the server
    watches a pipe only the parent holds, so nothing is left listening on the private port, and no orphan."""
    server = _serve(sample_index_dir)
    proc = server.proc
    llm_pid = None
    try:
        port = server.port
        with RetrieverClient(f"127.0.0.1:{port}", NO_RETRY) as c:
            _stream(c.generate(QUESTION, 2, max_tokens=4))
            backend = c.status().generation_backend
        m = re.search(r"embedded llama.cpp \((http://[\d.:]+/v1)\)", backend)
        assert m, backend
        base_url = m.group(1)
        children = [pid for f in Path(f"/proc/{proc.pid}/task").glob("*/children") for pid in f.read_text().split()]
        llama = [int(pid) for pid in children if b"llama_cpp.server" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(llama) == 1, children
        llm_pid = llama[0]
        assert _answers(base_url)
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _answers(base_url) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _answers(base_url), f"the llama.cpp server (pid {llm_pid}) outlived its killed parent"
        status = Path(f"/proc/{llm_pid}/status")
        while status.exists() and "State:\tZ" not in status.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)  # exited (gone, or a zombie left to a pid 1 that does not reap)
        assert not status.exists() or "State:\tZ" in status.read_text()
        llm_pid = None
    finally:
        if proc.poll() is None:
            proc.kill()
        if llm_pid is not None:  # the test failed: do not leave the orphan behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(llm_pid, signal.SIGKILL)


# ---------------------------------------------------------------------- the same answers over the HTTP door


def _sse(response) -> list[tuple[str, dict]]:
    """The events of a text/event-stream response, as (event, data) pairs, in order."""
    events, event, data = [], "message", ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data += line[6:]
        elif not line and data:
            events.append((event, json.loads(data) if data != "[DONE]" else data))
            event, data = "message", ""
    return events


def test_http_generate_streams_the_grpc_answer_as_sse(server):
    """POST /v1/generate: passages, token..., stats, done; a repeat of a gRPC answer is the same answer (the
    cache is the core's, shared by both doors)."""
    question = "Why does water boil at a lower temperature on a mountain?"
    with RetrieverClient(server.target, NO_RETRY) as c:
        msgs, err = _stream(c.generate(question, 3, max_tokens=16))
    assert err is None
    with httpx.stream("POST", server.http_url + "/v1/generate", timeout=120,
                      json={"retrieve": {"query": question, "top_k": 3}, "max_tokens": 16}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _sse(r)
    kinds = [k for k, _ in events]
    assert kinds[0] == "passages" and kinds[-2:] == ["stats", "done"] and set(kinds[1:-2]) == {"token"}
    assert [p["doc_id"] for p in events[0][1]["passages"]] == [p.doc_id for p in msgs[0].passages.passages]
    assert "".join(d["text"] for k, d in events if k == "token") == "".join(m.token for m in msgs[1:-1])
    stats = events[-2][1]
    assert stats["cache_hit"] and stats["tokens_out"] == msgs[-1].stats.tokens_out and stats["model"] == "smollm2"
    r = httpx.post(server.http_url + "/v1/generate", json={"retrieve": {"query": question}, "max_tokens": 5000},
                   timeout=60)  # refused before the stream starts: its own status, not an event
    assert r.status_code == 400 and "max_tokens must be in [1, " in r.json()["error"]["message"]


def test_the_openai_client_gets_cited_answers_streamed_and_not(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    messages = [{"role": "system", "content": "ignored: the server's prompt applies"},
                {"role": "user", "content": "How do honeybees tell each other where flowers are?"}]
    done = client.chat.completions.create(model="hybridrag", messages=messages, max_tokens=16,
                                          extra_body={"retrieval": {"top_k": 3}})
    answer = done.choices[0].message.content
    assert answer.strip() and done.choices[0].finish_reason in ("stop", "length") and done.model == "hybridrag"
    assert done.usage.completion_tokens > 0 and done.usage.prompt_tokens > 50
    cites = done.model_extra["citations"]
    assert [c["number"] for c in cites] == [1, 2, 3] and cites[0]["doc_id"] == "bio-012"
    assert done.model_extra["hybridrag"]["stats"]["passages_in_prompt"] == 3
    stream = client.chat.completions.create(model="hybridrag", messages=messages, max_tokens=16, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"retrieval": {"top_k": 3}})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].model_extra["citations"] == cites
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == answer  # the cached answer
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] in ("stop", "length")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == done.usage.completion_tokens
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="hybridrag", messages=[{"role": "system", "content": "hi"}])
    assert "must hold a 'user' message" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="hybridrag", messages=messages, extra_body={"retrieval": {"top_k": 999}})
    assert "top_k must be in [1, 100], got 999" in str(e.value)


def test_an_http_client_that_disconnects_closes_the_backend_stream(server, llm):
    backend = server.running.state.generation.generator.backends["default"]
    during = 0
    with httpx.stream("POST", server.http_url + "/v1/generate", timeout=120,
                      json={"retrieve": {"query": "Explain in detail how a pressure cooker works.", "top_k": 3,
                                         "bypass_cache": True}, "max_tokens": 1000}) as r:
        lines = r.iter_lines()
        seen = []
        for line in lines:
            if line.startswith("event: "):
                seen.append(line[7:])
            if seen.count("token") >= 2:
                break
        assert seen[0] == "passages" and backend.open_streams == 1
        during = _established_to(llm.port)
    # leaving the block closed the connection mid-answer
    t = time.monotonic()
    while (backend.open_streams or _established_to(llm.port) >= during) and time.monotonic() - t < 5:
        time.sleep(0.02)
    assert backend.open_streams == 0 and _established_to(llm.port) == during - 1
    metric = server.running.state.metrics.registry.get_sample_value
    assert metric("hybridrag_requests_total", {"method": "Generate", "code": "CANCELLED", "transport": "http"}) >= 1
    # the deadline passing mid-answer ends the stream with an error event, and closes the backend stream too
    with httpx.stream("POST", server.http_url + "/v1/generate", timeout=120, headers={"x-timeout-ms": "1000"},
                      json={"retrieve": {"query": "Explain in detail how a pressure cooker works.", "top_k": 2,
                                         "bypass_cache": True}, "max_tokens": 1000}) as r:
        events = _sse(r)
    assert events[0][0] == "passages" and events[-1][0] == "error"
    assert events[-1][1]["error"]["status"] == "DEADLINE_EXCEEDED"
    t = time.monotonic()
    while backend.open_streams and time.monotonic() - t < 5:
        time.sleep(0.02)
    assert backend.open_streams == 0


CHROMIUM = "/usr/bin/chromium"


def test_the_playground_in_a_real_browser(server):
    """Debian's chromium driven by Playwright: type a question, ask; the page shows the passages with their stage
    ranks and the streamed answer with its citations, and both equal what the API answers."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian chromium is not installed (apt-get install chromium)")
    question = "Why is Venus hotter than Mercury?"  # asked by no other test here: not an answer-cache hit
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page()
            console: list[str] = []
            page.on("console", lambda m: console.append(m.text))
            page.goto(server.http_url + "/")  # redirects to /playground
            assert page.title() == "hybridrag playground"
            page.fill("#query", question)
            page.fill("#topk", "3")
            page.click("#ask")
            # a selector, not wait_for_function: the page's CSP allows no string evaluation ('unsafe-eval')
            page.wait_for_selector("#status:text-is('done')", timeout=120_000)
            shown = page.eval_on_selector_all("#passages tr", "rows => rows.map(r => r.dataset.docId)")
            badges = page.eval_on_selector_all("#passages tr:first-child .stage", "bs => bs.map(b => b.dataset.stage)")
            answer = page.inner_text("#answer")
            stats = page.inner_text("#stats")
            timings = page.inner_text("#timings")
            assert page.inner_text("#error") == ""
            assert not [m for m in console if "Content Security Policy" in m], console  # the page passes its CSP
        finally:
            browser.close()
    request = {"query": question, "top_k": 3, "options": {"stages": ["bm25", "dense", "late_interaction"]}}
    api = httpx.post(server.http_url + "/v1/retrieve", json=request, timeout=60).json()
    assert shown == [p["doc_id"] for p in api["passages"]]
    assert set(badges) >= {"bm25", "dense", "fused", "late_interaction"} and "late_interaction" in timings
    assert "cache hit" not in timings and "cached answer" not in stats
    with httpx.stream("POST", server.http_url + "/v1/generate", json={"retrieve": request}, timeout=120) as r:
        events = _sse(r)
    assert answer.strip() == "".join(d["text"] for k, d in events if k == "token").strip()  # the same (cached) answer
    assert "smollm2" in stats and "3 passages in the prompt" in stats
