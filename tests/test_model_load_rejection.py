"""The model-load scenario's HELLO rejection rests on the wire, not on the client's word:
llama-simple's "version mismatch" message counts as a rejection by the client only when this
run's connection carries the server's HELLO answer (and nothing after it)."""

from __future__ import annotations

from harness.capture.transcript import C2S, S2C, Transcript
from harness.impls.driver import ExitInfo
from harness.matrix.context import model_client_rejection
from harness.proto import get_dialect
from harness.proto import messages as msgs
from harness.proto.codec import pack_request, pack_response
from harness.scenario import REJECTED

D7, D9 = get_dialect("7.0.0"), get_dialect("9.0.0")
MISMATCH = ExitInfo(134, aborted=True, message="RPC server version mismatch: 9.0.0")


def _hello(answered: bool, *, then: bytes = b"") -> Transcript:
    tr = Transcript()
    tr.add(1.0, C2S, pack_request(D7, msgs.HelloRequest()))
    if answered:
        tr.add(1.1, S2C, pack_response(D9, msgs.HelloResponse(major=9)))
    if then:
        tr.add(1.2, C2S, then)
    tr.close(1.3, C2S, "fin")
    return tr


def _judge(*transcripts: Transcript):
    return model_client_rejection(None, MISMATCH, [t.decode() for t in transcripts])


def test_the_servers_hello_answer_on_the_wire_makes_it_a_client_rejection():
    obs = _judge(_hello(True))
    assert obs.outcome == REJECTED and obs.rejected_by == "client"
    assert all(c.ok for c in obs.checks) and obs.facts["server_version"] == "9.0.0"


def test_without_the_servers_hello_answer_the_message_is_not_evidence():
    # planted: the server never answered HELLO (the client's message says otherwise); the
    # rule before took the message and filed a rejection by the client
    unanswered = _judge(_hello(False))
    assert unanswered.rejected_by != "client"
    nothing = _judge()  # no connection of this run at all
    assert nothing.outcome != REJECTED


def test_a_client_that_goes_on_after_the_hello_it_rejected_fails_its_check():
    more = pack_request(D7, msgs.DeviceCountRequest())
    obs = _judge(_hello(True, then=more))
    assert obs.rejected_by == "client" and not all(c.ok for c in obs.checks)
