"""The door's OpenAPI document: the REST bodies' JSON Schemas generated from the proto messages (so they cannot
drift from ``proto/``), the OpenAI-compatible bodies' from their pydantic models, the error shape every route may
answer with, and the API key every ``/v1/`` route needs."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from pydantic import BaseModel

from retrieval.api import retriever_pb2 as pb
from retrieval.serving.http.convert import OPAQUE_INT64

_SCALAR: dict[int, dict[str, Any]] = {
           FieldDescriptor.TYPE_STRING: {"type": "string"}, FieldDescriptor.TYPE_BOOL: {"type": "boolean"},
           FieldDescriptor.TYPE_DOUBLE: {"type": "number"}, FieldDescriptor.TYPE_FLOAT: {"type": "number"},
           FieldDescriptor.TYPE_INT32: {"type": "integer", "format": "int32"},
           FieldDescriptor.TYPE_UINT32: {"type": "integer", "format": "int32", "minimum": 0},
           FieldDescriptor.TYPE_INT64: {"type": "integer", "format": "int64"},
           FieldDescriptor.TYPE_UINT64: {"type": "integer", "format": "int64", "minimum": 0},
           FieldDescriptor.TYPE_ENUM: {"type": "string"}, FieldDescriptor.TYPE_BYTES: {"type": "string"}}


def proto_schemas(*messages: Descriptor) -> dict[str, dict[str, Any]]:
    """JSON Schemas (OpenAPI 3.1 components) of proto messages and every message they hold, by message name:
    the REST bodies' contract, generated from ``proto/`` so it cannot drift."""
    out: dict[str, dict[str, Any]] = {}

    def field_schema(f: FieldDescriptor) -> dict[str, Any]:
        if f.message_type is not None:
            visit(f.message_type)
            return {"$ref": f"#/components/schemas/{f.message_type.name}"}
        return dict(_SCALAR[f.type])

    def visit(d: Descriptor) -> None:
        if d.name in out:
            return
        out[d.name] = {}  # placeholder: recursion stops here
        props: dict[str, Any] = {}
        for f in d.fields:
            if f.message_type is not None and f.message_type.GetOptions().map_entry:
                props[f.name] = {"type": "object",
                                 "additionalProperties": field_schema(f.message_type.fields_by_name["value"])}
            elif f.is_repeated:
                props[f.name] = {"type": "array", "items": field_schema(f)}
            else:
                props[f.name] = field_schema(f)
            if f.name in OPAQUE_INT64:
                props[f.name] = {"type": ["string", "integer"], "format": "int64",
                                 "description": "an opaque id (a string in answers: it may exceed 2**53)"}
        out[d.name] = {"type": "object", "properties": props, "additionalProperties": False}
        if d.oneofs:
            out[d.name]["description"] = "exactly one of: " + ", ".join(f.name for f in d.oneofs[0].fields)

    for m in messages:
        visit(m)
    return out


ERROR_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["code", "status", "message", "type"], "properties": {
        "code": {"type": "integer"}, "status": {"type": "string"}, "message": {"type": "string"},
        "type": {"type": "string"}}},
        "request_id": {"type": "string"}}}
ERROR_STATUSES = {400: "the request is invalid (the message names the field)", 401: "no valid API key",
                  403: "the key may not do this, or a browser request from another origin",
                  408: "the request did not arrive in time", 413: "the body is over http.max_body_mb",
                  415: "the body is not application/json in UTF-8", 429: "overloaded: retry later",
                  503: "not ready, or a backend is unavailable", 504: "the deadline passed"}


def error_spec() -> dict[int | str, dict[str, Any]]:
    """The error answers every API route may give, in the service's error shape."""
    ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    return {status: {"description": what, "content": ref} for status, what in ERROR_STATUSES.items()}


def body_spec(name: str, required: bool = True) -> dict[str, Any]:
    return {"requestBody": {"required": required, "content": {
        "application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}}}


def model_spec(model: type[BaseModel]) -> dict[str, Any]:
    """The request body spec of a route that parses ``model`` itself (after authentication; the schema is added
    to the components by :func:`model_schemas`)."""
    return body_spec(model.__name__)


def model_schemas(*models: type[BaseModel]) -> dict[str, dict[str, Any]]:
    """JSON Schemas of pydantic models (and the models they hold), by name, for the OpenAPI components."""
    out: dict[str, dict[str, Any]] = {}
    for m in models:
        schema = m.model_json_schema(ref_template="#/components/schemas/{model}")
        out.update(schema.pop("$defs", {}))
        out[m.__name__] = schema
    return out


def ok_spec(name: str) -> dict[int | str, dict[str, Any]]:
    """A route's answers: ``name`` on 200, the service's errors otherwise."""
    return {200: {"description": "OK", "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}},
            **error_spec()}


def install_openapi(app: FastAPI, models: tuple[type[BaseModel], ...]) -> None:
    """``/openapi.json`` with the proto messages' and ``models``' schemas among its components and the API key on
    every ``/v1/`` route (the probes and pages need none); built on first request, then kept."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            components = schema.setdefault("components", {})
            components.setdefault("schemas", {}).update(proto_schemas(
                pb.RetrieveRequest.DESCRIPTOR, pb.RetrieveResponse.DESCRIPTOR, pb.GenerateRequest.DESCRIPTOR,
                pb.GenerateResponse.DESCRIPTOR, pb.UpsertRequest.DESCRIPTOR, pb.UpsertResponse.DESCRIPTOR,
                pb.DeleteRequest.DESCRIPTOR, pb.DeleteResponse.DESCRIPTOR, pb.RebuildResponse.DESCRIPTOR,
                pb.IndexStatus.DESCRIPTOR))
            components["schemas"].update(model_schemas(*models))
            components["schemas"]["Error"] = ERROR_SCHEMA
            components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            for path, operations in schema["paths"].items():
                if path.startswith("/v1/"):
                    for operation in operations.values():
                        operation["security"] = [{"bearer": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
