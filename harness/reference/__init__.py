"""Reference ggml-rpc client and server built on harness.proto."""
