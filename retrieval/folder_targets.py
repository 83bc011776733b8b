"""Where a folder is synced to (:mod:`retrieval.folders`): a document store opened by this process, or a running
``serve --store`` over gRPC, behind one small interface; and the errors a sync ends with. A refusal the operator
must act on is :class:`SyncError` (one line, exit 2 at the command line); a target that does not answer is
:class:`SyncUnavailable` (a later round may succeed); one write the target refuses is :class:`Refused` (that file is
skipped with the reason)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from index_builder.errors import ConfigError, HybridRagError
from index_builder.types import Document

if TYPE_CHECKING:
    from retrieval.client import RetrieverClient
    from retrieval.live.store import DocumentStore

PAGE = 1000  # documents per listing page (the server's largest)
MAX_BACKOFF_S = 30.0
Say = Callable[[str], None]


class SyncError(HybridRagError):
    """A refusal the operator must act on (a key, a tenant, a damaged state): one line, no retry."""


class SyncUnavailable(SyncError):
    """The target did not answer (down, restarting, busy past its retries): a later round may succeed."""


class TargetRefused(SyncError):
    """The target refused a call (not a busy or absent one): ``code`` (the gRPC status name) and its ``details``."""

    def __init__(self, message: str, code: str, details: str) -> None:
        super().__init__(message)
        self.code, self.details = code, details


class Refused(Exception):
    """The target refused one write (an id another tenant holds, a document it finds invalid): the file is
    skipped with ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Listed(NamedTuple):
    id: str
    tenant: str
    metadata: Mapping[str, str]


class Target(Protocol):
    """Where a folder is synced to. ``tenant`` "" = every tenant (a key for all tenants, or a store)."""

    name: str

    def list_page(self, tenant: str, filters: Mapping[str, str], after: str) -> tuple[list[Listed], str]:
        """A page of documents in id order and the ``after`` of the next page ("" at the end)."""

    def held(self, tenant: str, ids: list[str]) -> set[str]:
        """Which of ``ids`` the target holds, from any writer (sorted ``ids``, all of ``tenant``)."""

    def upsert(self, docs: list[Document]) -> None:
        """Write a batch; :class:`Refused` when the target refuses it as a whole."""

    def delete(self, ids: list[str], tenant: str) -> None: ...


class StoreTarget:
    """A document store opened by this process (``build --corpus DIR --store S``)."""

    def __init__(self, store: DocumentStore) -> None:
        self.store = store
        self.name = f"the store {store.path}" if hasattr(store, "path") else "the store"

    def list_page(self, tenant: str, filters: Mapping[str, str], after: str) -> tuple[list[Listed], str]:
        rows = self.store.list_documents(tenant=tenant or None, filters=filters, after=after, limit=PAGE)
        return [Listed(i, t, m) for i, t, _, m, _ in rows], rows[-1][0] if len(rows) == PAGE else ""

    def held(self, tenant: str, ids: list[str]) -> set[str]:
        return {i for i in ids if self.store.get(i) is not None}

    def upsert(self, docs: list[Document]) -> None:
        from retrieval.errors import InvalidRequest, PermissionDenied

        try:
            self.store.upsert(docs)
        except (InvalidRequest, PermissionDenied) as e:
            raise Refused(str(e)) from None

    def delete(self, ids: list[str], tenant: str) -> None:
        self.store.delete(ids, tenant=tenant or None)


class ServerTarget:
    """A running ``serve --store`` over gRPC. Calls the server refuses because it is busy (RESOURCE_EXHAUSTED) are
    retried with backoff; a server that does not answer is :class:`SyncUnavailable`; other refusals are
    :class:`SyncError` naming what was refused (``key_hint`` says where the key comes from)."""

    TRANSIENT = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "CANCELLED", "ABORTED", "INTERNAL",
                 "UNKNOWN")

    def __init__(self, client: RetrieverClient, address: str, *, key_hint: str = "", busy_attempts: int = 6,
                 say: Say | None = None) -> None:
        self.client, self.name, self.key_hint, self.busy_attempts = client, address, key_hint, busy_attempts
        self.say = say or (lambda _: None)

    @classmethod
    def connect(cls, address: str, api_key: str = "", tls_ca: str = "", **kwargs: Any) -> ServerTarget:
        """A client of ``address`` (nothing is sent yet: a server that is down is found by the first round)."""
        from retrieval.client import ClientOptions, RetrieverClient

        try:
            return cls(RetrieverClient(address, ClientOptions(api_key=api_key, tls_ca=tls_ca)), address, **kwargs)
        except OSError as e:
            raise ConfigError(f"cannot read the TLS CA file {tls_ca}: {e.strerror or e}") from None

    def close(self) -> None:
        self.client.close()

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        import grpc

        for attempt in range(self.busy_attempts):
            try:
                return fn()
            except grpc.RpcError as e:
                code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
                details = (e.details() if hasattr(e, "details") else "") or ""
                details = " ".join(details.split())[:300]
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED and attempt < self.busy_attempts - 1:
                    wait = min(MAX_BACKOFF_S, 2.0 ** attempt)
                    self.say(f"{what}: the server is busy ({details}); retrying in {wait:.0f} s")
                    time.sleep(wait)
                    continue
                if code.name in self.TRANSIENT:
                    raise SyncUnavailable(f"{self.name} is unavailable ({code.name}: {details})") from None
                if code == grpc.StatusCode.UNAUTHENTICATED:
                    raise SyncError(f"{self.name} refused the API key: {details}"
                                    + (f" ({self.key_hint})" if self.key_hint else "")) from None
                raise TargetRefused(f"{self.name} refused {what}: {code.name}: {details}", code.name,
                                    details) from None
        raise AssertionError("unreachable")

    def list_page(self, tenant: str, filters: Mapping[str, str], after: str) -> tuple[list[Listed], str]:
        page = self._call("a listing", lambda: self.client.list_documents(tenant=tenant, filters=filters, after=after,
                                                                     limit=PAGE, timeout=60.0))
        return [Listed(d.id, d.tenant, dict(d.metadata)) for d in page.documents], page.next_after

    def held(self, tenant: str, ids: list[str]) -> set[str]:
        """A scan of ``tenant``'s ids from just before the first of ``ids`` to the last (one call per page)."""
        wanted, found, after = set(ids), set(), ids[0][:-1]
        while True:
            page, after = self.list_page(tenant, {}, after)
            found |= wanted.intersection(d.id for d in page)
            if not after or after >= ids[-1]:
                return found

    def upsert(self, docs: list[Document]) -> None:
        from retrieval.api import retriever_pb2 as pb

        msgs = [pb.Document(id=d.id, title=d.title, text=d.text, tenant=d.tenant, metadata=d.metadata) for d in docs]
        try:
            self._call("an upsert", lambda: self.client.upsert(msgs, timeout=600.0))
        except TargetRefused as e:
            if e.code not in ("PERMISSION_DENIED", "INVALID_ARGUMENT"):
                raise
            raise Refused(f"the server refused it: {e.details}") from None

    def delete(self, ids: list[str], tenant: str) -> None:
        self._call(f"a delete in tenant {tenant!r}", lambda: self.client.delete(ids, tenant=tenant, timeout=120.0))
