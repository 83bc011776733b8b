"""Fuzzing the HTTP door of ``hybridrag serve`` as users run it (a subprocess with a document store, API keys bound
to tenants and ``--http-port``), beside the gRPC door's fuzz test (``test_fuzz.py``):

1. schemathesis against the door's own ``/openapi.json`` (fetched from the running server): every operation, a
   seeded, bounded number of generated requests each (valid and schema-violating), with a key or without;
2. a seeded raw-body fuzzer (:mod:`tests.retrieval.serving.http_fuzzing`) over httpx and raw sockets: every route
   with a body gets deep nesting, huge and non-finite numbers, other encodings, lone surrogates, wrong JSON types
   for every field, wrong content parts, chunked and truncated bodies, NUL bytes, bodies near the 16 MiB limit,
   duplicate keys and wrong content-types.

No request may get a 5xx, but the 503 of the generation routes (the server has no generator) and the 504 of a
caller's own ``x-timeout-ms``; every 4xx is in the service's error shape, and where the door's rules decide the
status (no key: 401, not JSON in UTF-8: 415, over 16 MiB: 413, refused by the bounded JSON parser: 400) it is that
one; the 200 answers match /openapi.json; no error message echoes megabytes of the request; the server logs no
traceback and no ERROR line; afterwards it still answers a normal query over both doors and its health is SERVING.
The server (``fuzz_server``, tests/conftest.py) is the gRPC fuzzer's too: one ``hybridrag serve`` with both doors,
started and warmed once a session. The server's RSS before and after the raw pass is printed (``pytest -s``) and
recorded as a test property, and the requests per route and status are printed.
"""

from __future__ import annotations

import random
import re
import time
from collections import Counter
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from retrieval.api import retriever_pb2 as pb
from retrieval.api import retriever_pb2_grpc as pb_grpc
from tests.retrieval.serving.fuzzing import MB, FuzzServer
from tests.retrieval.serving.http_fuzzing import (
    GENERATION_PATHS,
    MAX_MESSAGE,
    ROUTES,
    HttpFuzzer,
    HttpOutcome,
    base_body,
    error_shape_problem,
    message_length,
    per_category,
    per_route,
    problems,
    run_cases,
)

SERVICE = "hybridrag.v1.Retriever"
SEED = 4321
FUZZ_REQUESTS = 2000  # random cases; plus every field as every JSON type (498), 16 bodies near the
# 16 MiB limit, 16 over it, 10 megabyte values to be named in an error, 40 malformed framings
EXAMPLES_PER_OPERATION = 40  # schemathesis: generated requests per operation (13 operations)
KEYS = ("key-acme", "key-admin", "key-two", None)  # None: no key (401 on /v1/ routes)


def _normal_retrieve(server: FuzzServer) -> dict[str, Any]:
    r = httpx.post(server.http_url + "/v1/retrieve", headers={"x-api-key": "key-acme"}, timeout=60,
                   json={"query": "how do bees find flowers", "top_k": 5, "tenant": "acme"})
    assert r.status_code == 200, (r.status_code, r.text[:500])
    return r.json()


def _assert_healthy(server: FuzzServer) -> None:
    assert server.alive(), "the server died:\n" + "".join(server.lines[-40:])
    health = httpx.get(server.http_url + "/healthz", timeout=10)
    assert health.status_code == 200 and health.json() == {"status": "ok"}, health.text
    ready = httpx.get(server.http_url + "/readyz", timeout=10)
    assert ready.status_code == 200 and ready.json() == {"status": "ready"}, ready.text
    with grpc.insecure_channel(server.target) as ch:
        status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=10)
        assert status.status == health_pb2.HealthCheckResponse.SERVING
        r = pb_grpc.RetrieverStub(ch).Retrieve(pb.RetrieveRequest(query="how do bees find flowers", top_k=5,
                                                                  tenant="acme"),
                                               metadata=(("x-api-key", "key-acme"),), timeout=30)
    assert len(r.passages) == 5 and all(p.tenant == "acme" for p in r.passages)
    passages = _normal_retrieve(server)["passages"]
    assert len(passages) == 5 and all(p["tenant"] == "acme" for p in passages), passages


def _settle(server: FuzzServer) -> int:
    time.sleep(0.5)
    return server.rss


def _report(record_property, name: str, before: int, after: int) -> None:
    record_property(f"{name}_rss_before_mb", round(before / MB, 1))
    record_property(f"{name}_rss_after_mb", round(after / MB, 1))
    print(f"\n[{name}] server RSS before {before / MB:.1f} MiB, after {after / MB:.1f} MiB, "
          f"growth {(after - before) / MB:+.1f} MiB")


def _bad_log_lines(lines: list[str], limit: int = 30) -> list[str]:
    """The log's tracebacks and ERROR lines (with the lines that follow a traceback's start)."""
    out = []
    for i, ln in enumerate(lines):
        if "Traceback" in ln or " ERROR " in ln:
            out.extend(x.rstrip()[:300] for x in lines[i:i + 12])
            if len(out) >= limit:
                break
    return out[:limit]


def _print_table(name: str, counts: dict[str, Counter[str]]) -> None:
    total = sum(sum(c.values()) for c in counts.values())
    print(f"[{name}] {total} requests")
    for route in sorted(counts):
        c = counts[route]
        print(f"[{name}]   {route:28s} {sum(c.values()):5d}  " + ", ".join(f"{s}: {n}" for s, n in sorted(c.items())))


# ---------------------------------------------------------------------- schemathesis


class SchemathesisRun:
    """What one schemathesis pass over every operation found: status counts per operation, and the problems."""

    def __init__(self) -> None:
        self.counts: dict[str, Counter[str]] = {}
        self.server_errors: list[str] = []  # 5xx (but a generation route's 503)
        self.shape_errors: list[str] = []  # a 4xx (or the 503) not in the service's error shape
        self.schema_failures: dict[tuple[str, str], str] = {}  # (operation, check) -> the first failure
        self.undocumented: Counter[str] = Counter()  # "operation status": statuses the OpenAPI does not declare
        self.unsendable: Counter[str] = Counter()  # cases the client could not send (bad header values...)
        self.seconds = 0.0
        self.log: list[str] = []  # the server's log lines meanwhile


def _operation_test(op: Any, out: SchemathesisRun, base_url: str, session: Any, keys: tuple[str | None, ...],
                    declared: set[str]) -> Any:
    """The seeded, bounded hypothesis test of one operation: each generated case sent with one of ``keys``, its
    answer judged into ``out`` (nothing raised: every operation runs, every problem is kept)."""
    import requests
    from hypothesis import HealthCheck, Phase, example, given, seed, settings
    from hypothesis import strategies as st
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error
    from schemathesis.core.failures import FailureGroup
    from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

    label, path = op.label, op.path
    counts = out.counts.setdefault(label, Counter())
    cases = st.one_of(op.as_strategy(GenerationMode.POSITIVE), op.as_strategy(GenerationMode.NEGATIVE))

    @seed(SEED)
    @settings(max_examples=EXAMPLES_PER_OPERATION, database=None, deadline=None, derandomize=False,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=cases, key=st.sampled_from(keys))
    def one(case: Any, key: str | None) -> None:
        if case.headers:  # the generated credentials: ours replace them
            case.headers.pop("Authorization", None)
            case.headers.pop("authorization", None)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            response = case.call(base_url=base_url, session=session, headers=headers, timeout=60)
        except (requests.exceptions.InvalidHeader, ValueError, UnicodeError) as e:
            out.unsendable[f"{label}: {type(e).__name__}"] += 1
            return
        status = response.status_code
        counts[str(status)] += 1
        if str(status) not in declared:
            out.undocumented[f"{label} {status}"] += 1
        if status >= 500 and not (status == 503 and path in GENERATION_PATHS):
            out.server_errors.append(f"{label} -> {status}: {response.text[:300]!r}\n    "
                                     f"{case.as_curl_command(headers=headers)[:2000]}")
        if path not in GENERATION_PATHS:  # schemathesis's own check too (it knows no allowed 503)
            try:
                case.validate_response(response, checks=[not_a_server_error], headers=headers)
            except (FailureGroup, AssertionError) as e:
                out.server_errors.append(f"{label} [not_a_server_error]: {e}"[:2000])
        if (400 <= status < 500 and path.startswith("/v1/")) or (status == 503 and path in GENERATION_PATHS):
            ctype = (response.headers.get("content-type") or [""])[0]
            problem = error_shape_problem(status, ctype, response.content)
            if problem:
                out.shape_errors.append(f"{label} -> {status}: {problem}: {response.text[:200]!r}\n    "
                                        f"{case.as_curl_command(headers=headers)[:1000]}")
        for check in (response_schema_conformance, content_type_conformance):
            try:
                case.validate_response(response, checks=[check], headers=headers)
            except (FailureGroup, AssertionError) as e:
                out.schema_failures.setdefault((label, check.__name__), f"{e}"[:1500])

    # Explicit examples first: a valid body under each key that may use it (generated bodies seldom pass the
    # service's own checks: these make sure the 200 answers' schemas are checked too).
    if op.method.upper() in ("POST", "DELETE") and path != "/v1/rebuild":
        rng = random.Random(SEED)
        for i, key in enumerate(k for k in keys if k in ("key-acme", "key-admin")):
            body = base_body(op.method.upper(), path, rng, i)
            one = example(case=op.Case(body=body, media_type="application/json"), key=key)(one)
    elif op.method.upper() == "GET":
        one = example(case=op.Case(), key="key-acme")(one)
    return one


def _run_schemathesis(base_url: str) -> SchemathesisRun:
    """Every operation of the server's own /openapi.json, one after the other."""
    import requests
    import schemathesis

    schema = schemathesis.openapi.from_url(base_url + "/openapi.json", timeout=30)
    out = SchemathesisRun()
    session = requests.Session()
    t0 = time.perf_counter()
    for result in schema.get_all_operations():
        op = result.ok()
        declared = {str(s) for s in op.definition.raw.get("responses", {})}
        keys = tuple(k for k in KEYS if not (op.path == "/v1/rebuild" and k == "key-admin"))  # no real rebuilds
        _operation_test(op, out, base_url, session, keys, declared)()
    out.seconds = time.perf_counter() - t0
    session.close()
    return out


@pytest.fixture(scope="module")
def schemathesis_run(fuzz_server) -> SchemathesisRun:
    mark = fuzz_server.mark()
    run = _run_schemathesis(fuzz_server.http_url)
    run.log = fuzz_server.since(mark)
    _print_table("schemathesis", run.counts)
    print(f"[schemathesis] {sum(sum(c.values()) for c in run.counts.values())} requests over "
          f"{len(run.counts)} operations in {run.seconds:.1f} s; unsendable: {dict(run.unsendable)}")
    if run.undocumented:
        print("[schemathesis] statuses /openapi.json does not declare: "
              + ", ".join(f"{k}: {n}" for k, n in sorted(run.undocumented.items())))
    return run


@pytest.mark.slow  # schemathesis: ~500 generated requests over every operation, with the fuzz server's start
def test_schemathesis_finds_no_server_error_on_any_operation(fuzz_server, schemathesis_run, record_property):
    run = schemathesis_run
    record_property("schemathesis_requests", sum(sum(c.values()) for c in run.counts.values()))
    record_property("schemathesis_seconds", round(run.seconds, 1))
    expected_ops = {f"{m} {p}" for m, p in ROUTES} | {"GET /v1/status", "GET /healthz", "GET /readyz", "GET /metrics",
                                                      "GET /v1/models"}
    assert expected_ops <= set(run.counts), sorted(expected_ops - set(run.counts))
    # operations with inputs (a key, a body) get their examples; the probes and pages take none: a few cases each
    assert all(sum(c.values()) >= (EXAMPLES_PER_OPERATION // 2 if " /v1/" in op else 1)
               for op, c in run.counts.items()), run.counts
    assert not run.server_errors, "5xx answers:\n" + "\n".join(run.server_errors[:10])
    assert not run.shape_errors, "errors not in the service's shape:\n" + "\n".join(run.shape_errors[:10])
    bad = _bad_log_lines(run.log)
    assert not bad, "tracebacks or ERROR lines in the server's log:\n" + "\n".join(bad)
    _assert_healthy(fuzz_server)


@pytest.mark.slow  # the same schemathesis pass
def test_schemathesis_responses_conform_to_the_declared_schema(schemathesis_run):
    """The 200 answers match their declared schema and content type (schemathesis's response_schema_conformance and
    content_type_conformance), and every status answered is one /openapi.json declares for that operation (the
    service's errors are declared on every API route)."""
    assert not schemathesis_run.undocumented, dict(schemathesis_run.undocumented)
    failures = schemathesis_run.schema_failures
    assert not failures, "answers that do not conform to /openapi.json:\n" + "\n\n".join(
        f"{op} [{check}]\n{text}" for (op, check), text in sorted(failures.items()))


# ---------------------------------------------------------------------- the raw-body fuzzer


class RawRun:
    """One pass of the raw-body fuzzer: the outcomes, the server's RSS before and after, its log meanwhile."""

    def __init__(self, outcomes: list[HttpOutcome], cases: int, before: int, after: int, seconds: float,
                 log: list[str]) -> None:
        self.outcomes, self.cases, self.before, self.after, self.seconds, self.log = (outcomes, cases, before, after,
                                                                                      seconds, log)


@pytest.fixture(scope="module")
def raw_run(fuzz_server) -> RawRun:
    cases = HttpFuzzer(SEED).cases(FUZZ_REQUESTS)
    before = _settle(fuzz_server)
    mark = fuzz_server.mark()
    t0 = time.perf_counter()
    outcomes = run_cases(fuzz_server.http_url, cases, workers=4, timeout=60)
    elapsed = time.perf_counter() - t0
    after = _settle(fuzz_server)
    run = RawRun(outcomes, len(cases), before, after, elapsed, fuzz_server.since(mark))
    _print_table("http_fuzz", per_route(outcomes))
    print(f"[http_fuzz] {len(outcomes)} requests in {elapsed:.1f} s; by category: "
          + ", ".join(f"{k}: {n}" for k, n in sorted(per_category(outcomes).items())))
    edge = Counter(f"{o.case.route} {o.case.kind.rsplit(':', 1)[1]} -> {o.status}" for o in outcomes
                   if o.case.kind.endswith((":huge", ":over-limit")))
    print("[http_fuzz] at and over the 16 MiB limit: " + ", ".join(f"{k}: {n}" for k, n in sorted(edge.items())))
    slowest = max(outcomes, key=lambda o: o.seconds)
    print(f"[http_fuzz] slowest: {slowest.seconds:.2f} s, {slowest.case.kind} ({slowest.status})")
    print(f"[http_fuzz] server log: {len(run.log)} lines, {sum(map(len, run.log))} bytes; the most frequent: "
          + str(Counter(re.sub(r"^[\d\-: ,]+|\d+", "", ln).strip()[:90] for ln in run.log).most_common(4)))
    return run


@pytest.mark.slow  # ~2,600 raw bodies (some of 16 MiB) over httpx and raw sockets
def test_thousands_of_raw_bodies_get_no_server_error(fuzz_server, raw_run, record_property):
    run = raw_run
    _report(record_property, "http_fuzz", run.before, run.after)
    record_property("http_fuzz_requests", len(run.outcomes))
    record_property("http_fuzz_seconds", round(run.seconds, 1))
    record_property("http_fuzz_log_lines", len(run.log))
    bad = problems(run.outcomes)
    for problem in bad.values():
        print("[http_fuzz] PROBLEM " + problem.describe())
    assert len(run.outcomes) == run.cases
    assert {o.case.route for o in run.outcomes} == {f"{m} {p}" for m, p in ROUTES}
    assert not bad, (f"{len(bad)} kinds of wrong answers:\n" + "\n".join(p.describe() for p in bad.values())
                     + "\nserver log:\n" + "\n".join(_bad_log_lines(run.log)))
    bad_lines = _bad_log_lines(run.log)
    assert not bad_lines, "tracebacks or ERROR lines in the server's log:\n" + "\n".join(bad_lines)
    _assert_healthy(fuzz_server)
    growth = run.after - run.before
    assert growth < 300 * MB, f"RSS grew by {growth / MB:.0f} MiB over {run.cases} requests"


@pytest.mark.slow  # the same raw pass
def test_error_messages_never_echo_megabytes_of_the_request(raw_run):
    """An error's message names what is wrong in at most 8 KiB (MAX_MESSAGE), as the gRPC door's status details
    must: a 1 MiB wrong-typed value, unknown field or stage name is not sent back whole."""
    long = {}
    for o in raw_run.outcomes:
        n = message_length(o)
        if n > MAX_MESSAGE:
            long.setdefault((o.case.kind, o.case.note), (n, o))
    assert not long, "error messages over 8 KiB:\n" + "\n".join(
        f"{kind}: {o.status}, a message of {n} characters: {o.body[:200]!r}...\n        {o.case.example()}"
        for (kind, _), (n, o) in sorted(long.items()))


def test_the_http_fuzzer_is_seeded_and_covers_every_route():
    a = HttpFuzzer(SEED).cases(600)
    b = HttpFuzzer(SEED).cases(600)
    assert [(c.kind, c.body, c.headers, c.wire) for c in a] == [(c.kind, c.body, c.headers, c.wire) for c in b]
    kinds = {c.kind for c in HttpFuzzer(SEED).cases(FUZZ_REQUESTS)}
    for method, path in ROUTES:
        for category in ("valid", "wrong-type", "deep", "number", "encoding", "surrogate", "nul", "duplicate-keys",
                         "content-type", "truncated", "huge", "over-limit", "framing"):
            assert any(k.startswith(f"{method} {path}:{category}") for k in kinds), (method, path, category)
    assert "POST /v1/chat/completions:chat-parts" in kinds
    every = [c for c in HttpFuzzer(SEED).cases(0) if c.kind.endswith(":every-field")]
    assert len(every) >= 400 and {c.route for c in every} == {f"{m} {p}" for m, p in ROUTES if p != "/v1/rebuild"}
    wires = Counter(c.wire for c in a)
    assert {"httpx", "chunked", "truncated-close", "truncated-half", "declared", "framing"} <= set(wires), wires
