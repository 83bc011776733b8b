"""Fuzzing ``hybridrag serve`` as users run it (a subprocess with a document store and API keys bound to tenants):
thousands of seeded requests, typed and raw bytes, to every RPC. No request, however malformed, may get UNKNOWN,
INTERNAL or DATA_LOSS, or hang; undecodable ones get INVALID_ARGUMENT and one short log line; oversized filter
values and tenants are refused without pinning memory; afterwards the server still answers a normal query.

The server (``fuzz_server``, tests/conftest.py) is the HTTP fuzzer's too (``test_http_fuzz.py``): started and warmed
once a session. The server's RSS before and after each batch is printed (``pytest -s``) and recorded as a test
property.
"""

from __future__ import annotations

import asyncio
import re
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from retrieval.api import retriever_pb2 as pb
from retrieval.api import retriever_pb2_grpc as pb_grpc
from tests.retrieval.serving.fuzzing import (
    MB,
    FuzzCase,
    FuzzServer,
    RequestFuzzer,
    forbidden,
    run_cases,
    summarize,
)

SERVICE = "hybridrag.v1.Retriever"
FUZZ_REQUESTS = 3000
SEED = 1234


def _normal_retrieve(server: FuzzServer, query: str = "how do bees find flowers") -> pb.RetrieveResponse:
    with grpc.insecure_channel(server.target) as ch:
        return pb_grpc.RetrieverStub(ch).Retrieve(pb.RetrieveRequest(query=query, top_k=5, tenant="acme"),
                                                  metadata=(("x-api-key", "key-acme"),), timeout=30)


def _assert_healthy(server: FuzzServer) -> None:
    assert server.alive(), "the server died:\n" + "".join(server.lines[-40:])
    with grpc.insecure_channel(server.target) as ch:
        status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=10)
    assert status.status == health_pb2.HealthCheckResponse.SERVING
    r = _normal_retrieve(server)
    assert len(r.passages) == 5 and all(p.tenant == "acme" for p in r.passages)


def _settle(server: FuzzServer) -> int:
    """The server's RSS once it is idle (a short pause lets finished calls free their buffers)."""
    time.sleep(0.5)
    return server.rss


def _report(record_property, name: str, before: int, after: int) -> None:
    record_property(f"{name}_rss_before_mb", round(before / MB, 1))
    record_property(f"{name}_rss_after_mb", round(after / MB, 1))
    print(f"\n[{name}] server RSS before {before / MB:.1f} MiB, after {after / MB:.1f} MiB, "
          f"growth {(after - before) / MB:+.1f} MiB")


def _errors_in_log(lines: list[str], limit: int = 30) -> str:
    picked = [ln.rstrip()[:300] for ln in lines if re.search(r"ERROR|Traceback|Exception", ln)]
    return "\n".join(picked[:limit])


UNDECODABLE = {  # invalid UTF-8 (ff fe) in a string field of each method's request
    "Retrieve": bytes.fromhex("0a02fffe"),  # query
    "Generate": bytes.fromhex("0a040a02fffe"),  # retrieve.query
    "Upsert": bytes.fromhex("0a040a02fffe"),  # documents[0].id
    "Delete": bytes.fromhex("0a02fffe"),  # ids[0]
}


@pytest.mark.parametrize("method", sorted(UNDECODABLE))
def test_an_undecodable_request_is_invalid_argument_with_one_short_log_line(fuzz_server, method):
    mark = fuzz_server.mark()
    with grpc.insecure_channel(fuzz_server.target) as ch:
        call = (ch.unary_stream if method == "Generate" else ch.unary_unary)(
            f"/{SERVICE}/{method}", request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as e:
            result = call(UNDECODABLE[method], metadata=(("x-api-key", "key-acme"),), timeout=10)
            if method == "Generate":
                list(result)
    time.sleep(0.3)  # the server's log line, if any, reaches the drain thread
    logged = fuzz_server.since(mark)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.value.code(), e.value.details(), "".join(logged))
    text = "".join(logged)
    assert "Traceback" not in text, text
    assert len(logged) <= 1 and all(len(ln) < 300 for ln in logged), text
    _assert_healthy(fuzz_server)


def _oversized(first: int, n: int) -> list[FuzzCase]:
    """Retrieves that each carry a distinct oversized value: ``n`` 1 MiB filter values under a tenant-bound key,
    ``n`` 1 MiB filter values and ``n`` 1 MiB tenants under the all-tenants key (numbered from ``first``)."""
    acme, admin = (("x-api-key", "key-acme"),), (("x-api-key", "key-admin"),)
    out = []
    for i in range(first, first + n):
        big = f"{i:08d}" * (MB // 8)
        for kind, req, metadata in (
                ("1MiB-filter-value", pb.RetrieveRequest(query=f"bees {i}", top_k=5, tenant="acme",
                                                         filters={"topic": big}), acme),
                ("1MiB-filter-value-any-tenant", pb.RetrieveRequest(query=f"rain {i}", top_k=5,
                                                                    filters={"topic": big}), admin),
                ("1MiB-tenant", pb.RetrieveRequest(query=f"stars {i}", top_k=5, tenant=big), admin)):
            out.append(FuzzCase(f"Retrieve:{kind}", "Retrieve", req.SerializeToString(), metadata))
    return out


def test_huge_filter_values_and_tenants_are_refused_without_pinning_memory(fuzz_server, record_property):
    """Each distinct oversized filter value or tenant used to be pinned by the filter-mask LRU and the semantic
    cache's scopes (gigabytes, never released): they are refused before any of that, so memory stays flat."""
    acme = (("x-api-key", "key-acme"),)
    # First (not measured: the largest requests grow the allocator's arenas and gRPC's buffers, and the last few
    # requests' objects are released only as later ones replace them): 8 MiB filter keys, 100,000 stage names.
    unmeasured = []
    for i in range(2):
        req = pb.RetrieveRequest(query="rain", top_k=5, tenant="acme", filters={f"{i}" * (8 * MB): "x"})
        unmeasured.append(FuzzCase("Retrieve:8MiB-filter-key", "Retrieve", req.SerializeToString(), acme))
    for i in range(5):  # known stage names, distinct queries: only the absence of a forbidden code is asserted
        req = pb.RetrieveRequest(query=f"orbit {i}", top_k=5, tenant="acme",
                                 options=pb.StageOptions(stages=["bm25", "dense"] * 50_000))
        unmeasured.append(FuzzCase("Retrieve:100k-stages", "Retrieve", req.SerializeToString(), acme))
    unmeasured += _oversized(10_000, 30)  # last, the same as the measured batch: what the server still holds of
    # its last calls (until later ones replace them) is then the same before and after
    outcomes = asyncio.run(run_cases(fuzz_server.target, unmeasured, clients=2, per_client=2, timeout=30))
    before = _settle(fuzz_server)
    # Measured: 180 distinct 1 MiB values (pinned, they would add about 180 MiB). Refused, what stays is noise:
    # garbage not yet collected (exception cycles hold their request) and allocator slack, up to about 40 MiB.
    outcomes += asyncio.run(run_cases(fuzz_server.target, _oversized(0, 60), clients=2, per_client=2, timeout=30))
    after = _settle(fuzz_server)
    _report(record_property, "huge_filters", before, after)
    codes = summarize(outcomes)
    print("[huge_filters] " + ", ".join(f"{k} -> {c}: {n}" for (k, c), n in sorted(codes.items())))
    bad = forbidden(outcomes)
    assert not bad, {k: (o.details[:160], o.case.example()) for k, o in bad.items()}
    refused = [o for o in outcomes if o.case.kind != "Retrieve:100k-stages"]
    assert all(o.code == grpc.StatusCode.INVALID_ARGUMENT for o in refused), sorted(codes.items())
    assert after - before < 64 * MB, f"RSS grew by {(after - before) / MB:.0f} MiB over 180 oversized requests"
    _assert_healthy(fuzz_server)


def test_thousands_of_fuzzed_requests_get_no_unknown_or_internal(fuzz_server, record_property):
    cases = list(RequestFuzzer(SEED).cases(FUZZ_REQUESTS))
    before = _settle(fuzz_server)
    mark = fuzz_server.mark()
    t0 = time.perf_counter()
    outcomes = asyncio.run(run_cases(fuzz_server.target, cases, clients=4, per_client=2, timeout=20))
    elapsed = time.perf_counter() - t0
    after = _settle(fuzz_server)
    _report(record_property, "fuzz", before, after)
    record_property("fuzz_seconds", round(elapsed, 1))
    codes = summarize(outcomes)
    by_code: dict[str, int] = {}
    for (_, c), n in codes.items():
        by_code[c] = by_code.get(c, 0) + n
    print(f"[fuzz] {len(outcomes)} requests in {elapsed:.1f} s; codes: {dict(sorted(by_code.items()))}")
    bad = forbidden(outcomes)
    for (kind, code), o in sorted(bad.items()):
        print(f"[fuzz] FORBIDDEN {kind} -> {code}: {o.details[:200]!r}\n        {o.case.example()}")
    assert len(outcomes) == len(cases)
    assert not bad, ("requests answered UNKNOWN/INTERNAL/DATA_LOSS, hung, or got status details too long for the client:\n"
                     + "\n".join(f"{k} -> {c}: {o.details[:160]!r} e.g. {o.case.example()}"
                                 for (k, c), o in sorted(bad.items()))
                     + "\nserver log:\n" + _errors_in_log(fuzz_server.since(mark)))
    # No generator on this server: Generate is refused (UNAVAILABLE or an earlier check), never answered.
    generated = {o.code.name for o in outcomes if o.case.method == "Generate"}
    assert "OK" not in generated, generated
    # Bad input is answered, not crashed on: no traceback anywhere in the server's log (a background thread's
    # included). The log's volume is reported.
    logged = fuzz_server.since(mark)
    record_property("fuzz_log_bytes", sum(map(len, logged)))
    print(f"[fuzz] server log: {len(logged)} lines, {sum(map(len, logged))} bytes")
    assert not any("Traceback" in ln for ln in logged), _errors_in_log(logged)
    _assert_healthy(fuzz_server)
    assert after - before < 300 * MB, f"RSS grew by {(after - before) / MB:.0f} MiB over {len(cases)} requests"


def test_the_fuzzer_is_seeded_and_covers_every_rpc():
    a = [(c.kind, c.payload, c.metadata) for c in RequestFuzzer(SEED).cases(400)]
    b = [(c.kind, c.payload, c.metadata) for c in RequestFuzzer(SEED).cases(400)]
    assert a == b
    kinds = {k for k, _, _ in a}
    for method in ("Retrieve", "Generate", "Upsert", "Delete", "GetIndexStatus"):
        assert f"{method}:typed" in kinds and any(k.startswith(f"{method}:raw:") for k in kinds), method
    assert any(k.startswith("Rebuild:") for k in {c.kind for c in RequestFuzzer(SEED).cases(FUZZ_REQUESTS)})
    assert max(len(p) for _, p, _ in a) <= 16 * MB
    assert sum(len(p) < 64 * 1024 for _, p, _ in a) > 0.9 * len(a)  # most payloads are small: the run stays fast


def test_a_rebuild_under_fuzzing_load(fuzz_server, record_property):
    """One real Rebuild (the all-tenants key) while fuzzed requests keep coming: no forbidden code, no hang, and
    the server serves the new generation afterwards. RSS is reported (a rebuild loads a new snapshot and encoder)."""
    with grpc.insecure_channel(fuzz_server.target) as ch:
        stub = pb_grpc.RetrieverStub(ch)
        stub.Upsert(pb.UpsertRequest(documents=[pb.Document(id="fuzz-rebuild", tenant="acme", title="Axolotl",
                                                            text="Axolotls regrow whole limbs from a blastema.")]),
                    metadata=(("x-api-key", "key-acme"),), timeout=30)
        generation = stub.GetIndexStatus(pb.GetIndexStatusRequest(), metadata=(("x-api-key", "key-acme"),),
                                         timeout=10).generation
    rebuild = FuzzCase("Rebuild:admin", "Rebuild", b"", (("x-api-key", "key-admin"),))
    cases = [rebuild] + list(RequestFuzzer(SEED + 1).cases(300))
    before = _settle(fuzz_server)
    outcomes = asyncio.run(run_cases(fuzz_server.target, cases, clients=2, per_client=2, timeout=30))
    after = _settle(fuzz_server)
    _report(record_property, "rebuild", before, after)
    bad = forbidden(outcomes)
    assert not bad, {k: (o.details[:160], o.case.example()) for k, o in bad.items()}
    assert outcomes[0].code == grpc.StatusCode.OK, outcomes[0].details
    _assert_healthy(fuzz_server)
    with grpc.insecure_channel(fuzz_server.target) as ch:
        stub = pb_grpc.RetrieverStub(ch)
        status = stub.GetIndexStatus(pb.GetIndexStatusRequest(), metadata=(("x-api-key", "key-acme"),), timeout=10)
        hit = stub.Retrieve(pb.RetrieveRequest(query="axolotl limbs blastema", top_k=3, tenant="acme"),
                            metadata=(("x-api-key", "key-acme"),), timeout=30)
    assert status.generation > generation and hit.passages[0].doc_id == "fuzz-rebuild"
