"""Running a list of steps on a fresh client of the cell, turning an early end into a verdict."""

from __future__ import annotations

from harness.impls.driver import ClientAborted, StepFailed
from harness.matrix.scenario import FAILED, Context, Observation, judge_abort


class Ended(Exception):
    """The client ended or refused a step; ``observation`` says what that means."""

    def __init__(self, observation: Observation):
        self.observation = observation


def run_steps(ctx: Context, steps: list[dict], *, connect: bool = True) -> list[dict]:
    """Run ``steps`` (after connect) on a new client; results in order (connect excluded)."""
    client = ctx.new_client()
    try:
        if connect:
            client.do("connect", endpoint=ctx.endpoint)
        out = [client.run(s).result for s in steps]
        client.do("close")
        return out
    except ClientAborted as e:
        client.close()
        raise Ended(judge_abort(ctx, e, ctx.sessions())) from None
    except StepFailed as e:
        raise Ended(Observation(FAILED, message=e.result.error,
                                signature=f"step-refused: {e.result.op}: {e.result.error}")) from None
    finally:
        client.close()
