"""Python stubs for the kubelet pod-resources v1 gRPC API (v1/api.proto).

The stubs are generated, then checked in, so that nodes need no protoc. They are built
with the protoc of grpcio-tools 1.72.2 because its gencode (protobuf 6.30.0) loads on
every protobuf runtime from 6.30 up, and the gRPC stub needs grpcio >= 1.72.2.
Regenerate from agent/attribution/:

    python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. podresources/v1/api.proto
    sed -i 's/^from podresources.v1 import/from . import/' podresources/v1/api_pb2_grpc.py

The sed makes the stub's import of api_pb2 relative, so that it works inside this package.
"""
