import os

from acme.grpc import grpc_service_pb2 as pb
from acme.server import DataPlane


class WhoAmIPlane(DataPlane):
    async def who_am_i(self, request: pb.WhoAmIRequest) -> pb.WhoAmIResponse:
        return pb.WhoAmIResponse(pid=os.getpid(), plane=type(self).__name__)
