"""Test support: real servers (Redis, gRPC services, the edge) started on free ports."""
