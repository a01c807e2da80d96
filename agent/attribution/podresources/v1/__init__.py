"""Generated messages (api_pb2) and service stubs (api_pb2_grpc) of pod-resources v1."""
