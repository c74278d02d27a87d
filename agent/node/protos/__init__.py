"""The Open Inference Protocol's gRPC messages and service (``grpc_predict_v2.proto``)
and their generated modules (``regenerate.py`` writes them; never edit by hand)."""
