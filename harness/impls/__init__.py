"""Adapters for what is under test: real llama.cpp builds, the reference peer, docker images."""
