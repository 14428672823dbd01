"""gRPC surfaces beside Publisher/Subscriber: google.pubsub.v1.SchemaService and google.iam.v1.IAMPolicy.
Translation only, like grpc_api."""

from __future__ import annotations

import grpc
from google.iam.v1 import iam_policy_pb2

from pigeon.api import access, errors
from pigeon.api.errors import translate
from pigeon.api.grpc_api import pb
from pigeon.core import names
from pigeon.node.engine import Engine



class SchemaApi:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.svc = engine.schemas

    @translate
    async def create_schema(self, req, context):
        return (await self.svc.create(req.parent, req.schema, req.schema_id)).SerializeToString()

    @translate
    async def get_schema(self, req, context):
        return self.svc.get(req.name, req.view).SerializeToString()

    @translate
    async def list_schemas(self, req, context):
        schemas, token = self.svc.list(names.project_of(req.parent), req.view, req.page_size, req.page_token)
        return pb["ListSchemasResponse"](schemas=schemas, next_page_token=token).SerializeToString()

    @translate
    async def list_schema_revisions(self, req, context):
        schemas, token = self.svc.list_revisions(req.name, req.view, req.page_size, req.page_token)
        return pb["ListSchemaRevisionsResponse"](schemas=schemas, next_page_token=token).SerializeToString()

    @translate
    async def commit_schema(self, req, context):
        return (await self.svc.commit(req.name, req.schema)).SerializeToString()

    @translate
    async def rollback_schema(self, req, context):
        return (await self.svc.rollback(req.name, req.revision_id)).SerializeToString()

    @translate
    async def delete_schema_revision(self, req, context):
        return (await self.svc.delete_revision(req.name, req.revision_id)).SerializeToString()

    @translate
    async def delete_schema(self, req, context):
        await self.svc.delete(req.name)
        return b""

    @translate
    async def validate_schema(self, req, context):
        await self.svc.validate_schema(req.parent, req.schema)
        return b""

    @translate
    async def validate_message(self, req, context):
        which = req.WhichOneof("schema_spec")
        await self.svc.validate_message(req.parent, req.name if which == "name" else "",
                                        req.schema if which == "schema" else None, req.message, req.encoding)
        return b""


class IamApi:
    def __init__(self, engine: Engine):
        self.engine = engine

    @translate
    async def set_iam_policy(self, req, context):
        return (await self.engine.iam.set_policy(req.resource, req.policy)).SerializeToString()

    @translate
    async def get_iam_policy(self, req, context):
        return self.engine.iam.get_policy(req.resource).SerializeToString()

    @translate
    async def test_iam_permissions(self, req, context):
        # answered for the caller (api.access set it); with security off there is no caller: everything applies
        granted = self.engine.iam.test_permissions(req.resource, list(req.permissions), access.CALLER.get(),
                                                   self.engine.config.admin_principals)
        return iam_policy_pb2.TestIamPermissionsResponse(permissions=granted).SerializeToString()


def handlers(engine: Engine) -> list[grpc.GenericRpcHandler]:
    s = SchemaApi(engine)
    schema = {
        "CreateSchema": errors.unary(s.create_schema, pb["CreateSchemaRequest"]),
        "GetSchema": errors.unary(s.get_schema, pb["GetSchemaRequest"]),
        "ListSchemas": errors.unary(s.list_schemas, pb["ListSchemasRequest"]),
        "ListSchemaRevisions": errors.unary(s.list_schema_revisions, pb["ListSchemaRevisionsRequest"]),
        "CommitSchema": errors.unary(s.commit_schema, pb["CommitSchemaRequest"]),
        "RollbackSchema": errors.unary(s.rollback_schema, pb["RollbackSchemaRequest"]),
        "DeleteSchemaRevision": errors.unary(s.delete_schema_revision, pb["DeleteSchemaRevisionRequest"]),
        "DeleteSchema": errors.unary(s.delete_schema, pb["DeleteSchemaRequest"]),
        "ValidateSchema": errors.unary(s.validate_schema, pb["ValidateSchemaRequest"]),
        "ValidateMessage": errors.unary(s.validate_message, pb["ValidateMessageRequest"]),
    }
    i = IamApi(engine)
    policy = {
        "SetIamPolicy": errors.unary(i.set_iam_policy, iam_policy_pb2.SetIamPolicyRequest),
        "GetIamPolicy": errors.unary(i.get_iam_policy, iam_policy_pb2.GetIamPolicyRequest),
        "TestIamPermissions": errors.unary(i.test_iam_permissions, iam_policy_pb2.TestIamPermissionsRequest),
    }
    return [
        grpc.method_handlers_generic_handler("google.pubsub.v1.SchemaService", schema),
        grpc.method_handlers_generic_handler("google.iam.v1.IAMPolicy", policy),
    ]
