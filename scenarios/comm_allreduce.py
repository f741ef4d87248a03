import numpy as np

from harness.reference.client import RefClient, ServerClosed, VersionRejected
from harness.reference.comm import BF16_MIN_ELEMENTS, bf16_to_fp32, fp32_to_bf16
from harness.proto import Cmd, RpcTensor, get_dialect, ggml
from harness.scenario import (FAILED, REJECTED, WORKS, Check, Observation, Scenario, Skip,
                              scenario)

SMALL, LARGE = 4, BF16_MIN_ELEMENTS  # LARGE is exchanged as bf16 (p8, spec 12.2)


def _values(n: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * 3.3).astype(np.float32)


def _upload(c: RefClient, values: np.ndarray) -> RpcTensor:
    ptr, _ = c.alloc_buffer(values.nbytes)
    t = RpcTensor.make(id=0x100 + len(values) % 251, type=ggml.TYPE_F32, ne=(len(values),),
                       buffer=ptr, data=c.buffer_get_base(ptr))
    c.set_tensor(t, values.tobytes())
    return t


def _download(c: RefClient, t: RpcTensor, n: int) -> np.ndarray:
    return np.frombuffer(bytes(c.get_tensor(t, 0, 4 * n)), dtype=np.float32)


def _expected(own: np.ndarray, peer: np.ndarray) -> np.ndarray:
    """What p8 leaves on a rank: its own f32 values plus the peer's, bf16-rounded when large."""
    if len(own) >= BF16_MIN_ELEMENTS:
        return own + bf16_to_fp32(fp32_to_bf16(peer))
    return own + peer


def _sum_check(name: str, got: np.ndarray, want: np.ndarray) -> Check:
    ok = got.tobytes() == want.tobytes()
    bad = int(np.count_nonzero(got != want))
    return Check(name, ok, "" if ok else f"{bad} of {len(want)} elements differ, first "
                 f"{got[got != want][:3].tolist()} vs {want[got != want][:3].tolist()}")


@scenario
class CommAllreduce(Scenario):
    id = "comm-allreduce"
    title = "Server-to-server allreduce (COMM_INIT / COMM_ALLREDUCE / COMM_FREE, world 2)"
    description = ("Two servers of the cell's server implementation: the cell's server (behind "
                   "the recording proxy) is rank 1, a second one rank 0, both on 127.0.0.1 (real "
                   "builds with loopback_bind). The reference client in the cell's client dialect "
                   "sends both COMM_INITs before reading either answer, then allreduces a 4- and "
                   "a 32768-element f32 tensor and frees the link; each rank must hold exactly "
                   "what p8 leaves (the large sum adds the peer's bf16 values).")
    evidence = ("COMM_INIT", "COMM_ALLREDUCE")
    checks = ("both COMM_INITs answer 1", f"{SMALL} elements: exact sum on both ranks",
              f"{LARGE} elements: own values plus the peer's bf16 values",
              "both servers serve after COMM_FREE")

    def applicable(self, ctx):
        if not get_dialect(ctx.server_dialect).has(Cmd.COMM_ALLREDUCE):
            return Skip(f"the server's dialect {ctx.server_dialect} has no COMM_* commands")
        return ctx.second_server_unavailable()

    def run(self, ctx):
        try:
            rank1 = ctx.ref_client()
        except VersionRejected as e:
            return Observation(REJECTED, rejected_by="client", message=str(e))
        except ServerClosed as e:
            return Observation(REJECTED, rejected_by="server", message=str(e))
        second = ctx.second_server()
        rank0 = RefClient.connect("127.0.0.1", second.port, ctx.client_dialect, timeout=30.0)
        try:
            return self._allreduce(ctx, rank0, rank1)
        except ServerClosed as e:
            return Observation(FAILED, message=str(e), signature=f"server closed: {e}")
        finally:
            rank0.close()
            rank1.close()

    def _allreduce(self, ctx, rank0: RefClient, rank1: RefClient) -> Observation:
        from harness.impls.supervisor import free_fixed_port
        port = free_fixed_port()
        rank0.send_comm_init(0, 2, port)
        rank1.send_comm_init(1, 2, port)
        oks = rank0.comm_init_result(), rank1.comm_init_result()
        checks = [Check("both COMM_INITs answer 1", all(oks), f"answers {oks}")]
        if not all(oks):
            return Observation(FAILED, checks=checks, signature=f"COMM_INIT answers {oks}")
        facts = {}
        for n, name in ((SMALL, f"{SMALL} elements: exact sum on both ranks"),
                        (LARGE, f"{LARGE} elements: own values plus the peer's bf16 values")):
            x, y = _values(n, 1), _values(n, 2)
            t0, t1 = _upload(rank0, x), _upload(rank1, y)
            rank0.comm_allreduce(t0)
            rank1.comm_allreduce(t1)
            got0, got1 = _download(rank0, t0, n), _download(rank1, t1, n)
            c0 = _sum_check(name, got0, _expected(x, y))
            c1 = _sum_check(name, got1, _expected(y, x))
            checks.append(Check(name, c0.ok and c1.ok,
                                "; ".join(f"rank {r}: {c.evidence}" for r, c in ((0, c0), (1, c1))
                                          if not c.ok)))
            facts[f"max_error_{n}"] = float(np.max(np.abs(got0 - (x + y))))
        rank0.comm_free()
        rank1.comm_free()
        alive = [c.get_alignment() > 0 for c in (rank0, rank1)]
        checks.append(Check("both servers serve after COMM_FREE", all(alive), f"{alive}"))
        ok = all(c.ok for c in checks)
        return Observation(WORKS if ok else FAILED, checks=checks, facts=facts,
                           signature=None if ok else "allreduce results differ from p8's")
