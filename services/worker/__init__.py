"""The regional inference worker: one engine (vLLM or the simulator) behind gRPC."""
