"""Partial-receive fuzzing of real RDMA servers over the project's soft verbs device.

``harness fuzz --transport rdma-soft --target p7`` makes the fuzzer the RDMA peer of the
pin's ``+rdma`` build: the reference client's pyverbs transport (:mod:`harness.transport.verbs`)
on softverbs (:mod:`harness.transport.softverbs`) says HELLO and sets up buffers as 7.0.0 does,
then writes a stream of valid requests as SENDs of sizes that do not match the server's reads.

* :mod:`.plans` -- the case (request stream + SEND plan), the SEND-plan registry, hypothesis
  strategies, the emulation's prediction;
* :mod:`.worker` -- the fuzzer process (pyverbs on the soft device, one case per request) and
  :class:`~.worker.FuzzPeer`, its handle;
* :mod:`.campaign` -- the target (the RDMA build on the soft device, restarted after deaths),
  verdicts (death, hang, overrun, liveness, rdma-error), dedupe, minimisation, reproducers and
  the report;
* :mod:`.replay` -- ``harness replay FILE --transport rdma-soft``.
"""
