"""Server conformance: the real server's recorded reactions to malformed input, as runnable cases."""
