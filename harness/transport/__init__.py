"""Byte transports: TCP with deadlines, fault-injecting delivery, emulated RDMA, pyverbs."""
