"""The SchemaService's state changes and the schema check on publish. Owns the rules: a schema is a list of
revisions (newest last); a topic with schema_settings accepts only messages valid under some revision of
its [first, last] range, and delivers them with the googclient_schema* attributes the service adds."""

from __future__ import annotations

import asyncio
import uuid

from pigeon.core.pubsub_types import types

from pigeon.broker.resources import Schema
from pigeon.core import limits, names
from pigeon.core.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from pigeon.node import schemas as engine_schemas
from pigeon.broker import commands
from pigeon.storage import records as R

_TYPE_NAMES = {1: "PROTOCOL_BUFFER", 2: "AVRO"}
_ENCODING_NAMES = {1: "JSON", 2: "BINARY"}
BASIC = types.SchemaView.BASIC
_PublishRequest = types.PublishRequest.pb()


def split_revision(name: str) -> tuple[str, str]:
    """`projects/p/schemas/s@rev` → (name, rev); rev is "" when absent."""
    base, _, rev = name.partition("@")
    return base, rev


class SchemaService:
    def __init__(self, engine):
        self.engine = engine

    @property
    def registry(self):
        return self.engine.state

    async def _compile(self, schema_type: int, definition: str):
        if schema_type not in _TYPE_NAMES:
            raise InvalidArgument("The schema type must be AVRO or PROTOCOL_BUFFER.")
        if not definition:
            raise InvalidArgument("The schema definition must not be empty.")
        return await asyncio.to_thread(engine_schemas.get_compiled, _TYPE_NAMES[schema_type], definition)

    def _revision(self, name: str, schema_type: int, definition: str):
        rev = Schema(name=name, type_=schema_type, definition=definition, revision_id=uuid.uuid4().hex[:8])
        rev.revision_create_time.FromMilliseconds(int(self.engine.clock.now() * 1000))
        return rev

    def view(self, rev, view: int):
        out = Schema()
        out.CopyFrom(rev)
        if view == BASIC:
            out.ClearField("definition")
            out.ClearField("revision_id")
            out.ClearField("revision_create_time")
        return out

    # --- reads ---------------------------------------------------------------------------------
    def get(self, name: str, view: int = 0):
        base, rev_id = split_revision(name)
        revs = self.registry.schema(base)
        if not rev_id:
            return self.view(revs[-1], view)
        for r in revs:
            if r.revision_id == rev_id:
                return self.view(r, view)
        raise NotFound(f"Revision {rev_id} of schema {base} not found.")

    def list(self, project: str, view: int, page_size: int, token: str):
        page, nxt = commands.page(commands.in_project(self.registry.schemas, project, "schemas"), page_size, token)
        return [self.view(self.registry.schemas[n][-1], view) for n in page], nxt

    def list_revisions(self, name: str, view: int, page_size: int, token: str):
        revs = list(reversed(self.registry.schema(name)))  # newest first
        size = min(page_size or limits.list_page_size_default, limits.list_page_size_max)
        start = int(token) if token.isdigit() else 0
        page = revs[start : start + size]
        nxt = str(start + size) if start + size < len(revs) else ""
        return [self.view(r, view) for r in page], nxt

    # --- changes -------------------------------------------------------------------------------
    async def create(self, parent: str, schema, schema_id: str):
        self.engine.check_open()
        project = names.project_of(parent)
        if not schema_id:
            schema_id = f"schema-{uuid.uuid4().hex[:12]}"
        names.check_id(schema_id, "schemas")
        name = names.join(project, "schemas", schema_id)
        if name in self.registry.schemas:
            raise AlreadyExists(f"Resource already exists in the project (resource={schema_id}).")
        self.registry.check_room(name, "schemas")
        await self._compile(schema.type_, schema.definition)
        rev = self._revision(name, schema.type_, schema.definition)
        await self.engine.change(R.SchemaPut(rev.SerializeToString(deterministic=True)))
        return rev

    async def commit(self, name: str, schema):
        self.engine.check_open()
        revs = self.registry.schema(name)
        if schema.type_ and schema.type_ != revs[-1].type_:
            raise InvalidArgument("A new revision must keep the schema's type.")
        await self._compile(revs[-1].type_, schema.definition)
        rev = self._revision(name, revs[-1].type_, schema.definition)
        await self.engine.change(R.SchemaPut(rev.SerializeToString(deterministic=True)))
        return rev

    async def rollback(self, name: str, revision_id: str):
        self.engine.check_open()
        old = self.get(f"{name}@{revision_id}") if revision_id else None
        if old is None:
            raise InvalidArgument("revision_id must be set.")
        rev = self._revision(name, old.type_, old.definition)
        await self.engine.change(R.SchemaPut(rev.SerializeToString(deterministic=True)))
        return rev

    async def delete_revision(self, name: str, revision_id: str):
        self.engine.check_open()
        base, rev_id = split_revision(name)
        rev_id = rev_id or revision_id
        target = self.get(f"{base}@{rev_id}") if rev_id else None
        if target is None:
            raise InvalidArgument("The revision to delete must be named (name@revision_id).")
        if len(self.registry.schema(base)) == 1:
            raise FailedPrecondition("The last revision of a schema cannot be deleted; delete the schema.")
        await self.engine.change(R.SchemaRevDel(base, rev_id))
        return target

    async def delete(self, name: str) -> None:
        self.engine.check_open()
        self.registry.schema(name)
        await self.engine.change(R.SchemaDel(name))

    async def validate_schema(self, parent: str, schema) -> None:
        names.project_of(parent)
        await self._compile(schema.type_, schema.definition)

    async def validate_message(self, parent: str, name: str, schema, message: bytes, encoding: int) -> None:
        names.project_of(parent)
        if encoding not in _ENCODING_NAMES:
            raise InvalidArgument("The encoding must be JSON or BINARY.")
        if name:
            rev = self.get(name)
            compiled = await self._compile(rev.type_, rev.definition)
        elif schema is not None:
            compiled = await self._compile(schema.type_, schema.definition)
        else:
            raise InvalidArgument("Either a schema name or a schema must be given.")
        compiled.validate(message, _ENCODING_NAMES[encoding])

    # --- topics --------------------------------------------------------------------------------
    def revisions_for(self, settings) -> list:
        revs = self.registry.schema(settings.schema)
        ids = [r.revision_id for r in revs]
        lo = ids.index(settings.first_revision_id) if settings.first_revision_id in ids else 0
        hi = ids.index(settings.last_revision_id) if settings.last_revision_id in ids else len(ids) - 1
        return revs[lo : hi + 1]

    async def check_topic_settings(self, topic) -> None:
        if not topic.HasField("schema_settings") or not topic.schema_settings.schema:
            return
        st = topic.schema_settings
        if st.schema == names.DELETED_SCHEMA:
            return
        revs = self.registry.schema(st.schema)
        ids = {r.revision_id for r in revs}
        for rid in (st.first_revision_id, st.last_revision_id):
            if rid and rid not in ids:
                raise InvalidArgument(f"Revision {rid} of schema {st.schema} does not exist.")
        if st.encoding not in _ENCODING_NAMES:
            raise InvalidArgument("schema_settings.encoding must be JSON or BINARY.")
        for r in self.revisions_for(st):
            await self._compile(r.type_, r.definition)

    def check_publish(self, topic_config, request: bytes) -> bytes:
        """Validate every message of a publish to a topic with a schema; return the request to store, with
        the googclient_schema* attributes added."""
        st = topic_config.schema_settings
        if st.schema == names.DELETED_SCHEMA:
            raise FailedPrecondition("The topic's schema was deleted: messages cannot be validated.")
        encoding = _ENCODING_NAMES[st.encoding]
        revs = self.revisions_for(st)
        compiled = [(r, engine_schemas.get_compiled(_TYPE_NAMES[r.type_], r.definition)) for r in revs]
        req = _PublishRequest.FromString(request)
        for m in req.messages:
            for rev, c in reversed(compiled):  # the newest revision that accepts it names it
                try:
                    c.validate(m.data, encoding)
                except InvalidArgument:
                    continue
                m.attributes["googclient_schemaname"] = st.schema
                m.attributes["googclient_schemaencoding"] = encoding
                m.attributes["googclient_schemarevisionid"] = rev.revision_id
                break
            else:
                raise InvalidArgument(f"Invalid data in message: it does not match schema {st.schema} "
                                      f"({encoding}) in the topic's revision range.")
        return req.SerializeToString()
