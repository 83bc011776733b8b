"""Issue 51: an answer never exceeds what the transport takes. 20 documents of 900,000 characters, mostly spaces
(one passage each: word pieces, not characters, bound a passage), made gRPC Retrieve fail with RESOURCE_EXHAUSTED
(a code the API keeps for overload) and HTTP send an 18 MB body; now the texts are cut so the answer fits 4 MiB
(gRPC clients' default receive limit), each cut passage says so (``truncated``, ``text_chars``), on a real
``hybridrag serve`` process."""

from __future__ import annotations

import re

import grpc
import httpx
import pytest

from index_builder.build.builder import build_snapshot
from index_builder.documents import chunking
from index_builder.types import Document
from retrieval.api import retriever_pb2 as pb
from retrieval.client import ClientOptions, RetrieverClient, RetryPolicy
from retrieval.errors import InvalidRequest
from retrieval.serving.answers import MESSAGE_HEADROOM, fit_response
from tests.helpers import ServeProcess

LIMIT = 4 * 2**20  # gRPC clients' default receive limit (the server's max_message_mb is 16 MiB)
NO_RETRY = ClientOptions(retry=RetryPolicy(attempts=1), timeout=600)


def _text(i: int) -> str:
    return f"Whales sing long songs, number {i}." + " " * 899_000 + " The end of the whale song."


def test_twenty_passages_of_900k_characters_fit_both_doors(tmp_path, monkeypatch, sample_docs, config, embedder):
    # Since issue 51 a passage is bounded in characters too (index_builder.documents.chunking.MAX_CHARS_PER_PIECE), so the
    # long passages come from an index chunked without that bound (an older snapshot): the doors must not rely on it.
    monkeypatch.setattr(chunking, "MAX_CHARS_PER_PIECE", 10**6)
    long_docs = [Document(id=f"space-{i}", title=f"Spaces {i}", tenant="sp", text=_text(i)) for i in range(20)]
    build_snapshot([*sample_docs, *long_docs], tmp_path / "index", config.build_config(), embedder)
    monkeypatch.undo()
    server = ServeProcess(["--index", str(tmp_path / "index"), "--store", str(tmp_path / "store.db"),
                           "--http-port", "0"], clean_env=True, env={"HYBRIDRAG_GENERATION__EMBEDDED__ENABLED": "false"})
    try:
        (url,) = re.findall(r"HTTP on (http://\S+)", server.text())
        with RetrieverClient(server.target, NO_RETRY) as c:
            r = c.retrieve("whales sing songs", 20, tenant="sp", bypass_cache=True, highlights=True)
        assert len(r.passages) == 20 and LIMIT - MESSAGE_HEADROOM - 4096 < r.ByteSize() <= LIMIT
        for p in r.passages:
            full = _text(int(p.doc_id[6:]))
            assert p.truncated and p.text_chars == len(full) and full.startswith(p.text)
            assert all(h.end <= len(p.text) and p.text[h.start:h.end] == h.text for h in p.highlights)
        h = httpx.post(url + "/v1/retrieve", json={"query": "whales sing songs", "top_k": 20, "tenant": "sp"},
                       timeout=600)
        assert h.status_code == 200 and len(h.content) <= LIMIT
        body = h.json()["passages"]
        assert len(body) == 20 and all(p["truncated"] and p["text_chars"] == len(_text(int(p["doc_id"][6:])))
                                       for p in body)
        with RetrieverClient(server.target, NO_RETRY) as c:  # a short answer is not touched
            small = c.retrieve("how do bees find flowers", 3, bypass_cache=True)
            assert small.passages and not any(p.truncated or p.text_chars for p in small.passages)
            # 70 documents with 64 KB of metadata each: 100 passages would not fit even with no text at all
            c.upsert([pb.Document(id=f"meta-{i}", tenant="meta", text=f"Walruses haul out on ice, number {i}.",
                                  metadata={f"k{j}": "v" * 1000 for j in range(64)}) for i in range(70)])
            with pytest.raises(grpc.RpcError) as e:
                c.retrieve("walruses haul out on ice", 100, tenant="meta", bypass_cache=True)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "limit of 4194304 bytes" in e.value.details()
        h = httpx.post(url + "/v1/retrieve", json={"query": "walruses haul out on ice", "top_k": 100, "tenant": "meta"},
                       timeout=600)
        assert h.status_code == 400 and "limit of 4194304 bytes" in h.json()["error"]["message"]
    finally:
        assert server.stop() == 0
    assert "Traceback" not in server.text()


def _passage(i: int, text: str, meta_chars: int = 0) -> pb.Passage:
    return pb.Passage(doc_id=f"d{i}", text=text, metadata={f"k{j}": "v" * meta_chars for j in range(64)} if meta_chars else {},
                      highlights=[pb.Highlight(start=0, end=5, text=text[:5]), pb.Highlight(start=len(text) - 5, end=len(text),
                                                                                           text=text[-5:])])


def test_long_texts_share_what_is_left_and_short_ones_stay_whole():
    limit = 2**20
    texts = ["short one " * 10, "é" * 600_000, "x" * 900_000, "medium " * 1000]
    r = fit_response(pb.RetrieveResponse(passages=[_passage(i, t) for i, t in enumerate(texts)]), limit)
    assert r.ByteSize() <= limit - MESSAGE_HEADROOM
    assert [p.truncated for p in r.passages] == [False, True, True, False]
    assert r.passages[0].text == texts[0] and r.passages[3].text == texts[3]
    cut = [len(p.text.encode()) for p in r.passages[1:3]]
    assert abs(cut[0] - cut[1]) <= 1 and r.passages[1].text == "é" * (cut[0] // 2)  # at a character boundary
    assert [p.text_chars for p in r.passages] == [0, 600_000, 900_000, 0]
    assert [len(p.highlights) for p in r.passages] == [2, 1, 1, 2]  # a highlight past the cut is dropped


def test_an_answer_that_cannot_fit_even_without_texts_is_invalid_argument():
    passages = [_passage(i, "some text", meta_chars=1000) for i in range(20)]  # 64 KB of metadata each
    with pytest.raises(InvalidRequest, match=r"over the limit of 1048576 bytes on an answer .*fewer passages than 20"):
        fit_response(pb.RetrieveResponse(passages=passages), 2**20)
