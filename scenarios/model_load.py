from harness.proto import client_accepts, get_dialect
from harness.scenario import FAILED, WORKS, Check, Observation, Scenario, Skip, scenario


@scenario
class ModelLoad(Scenario):
    id = "model-load"
    title = "Model load over RPC (end to end)"
    description = ("A real llama.cpp program (llama-simple) loads a tiny generated GGUF with every "
                   "layer on the RPC device and generates 24 tokens; the text must equal a local run.")
    checks = ("local and RPC text identical",)

    def applicable(self, ctx):
        if ctx.client_kind == "ref":
            return Skip("needs a real llama.cpp program as the client")
        if ctx.server_kind == "ref" and client_accepts(get_dialect(ctx.client_dialect).version,
                                                       get_dialect(ctx.server_dialect).version):
            # (across majors the HELLO rejection comes first, so the cell still runs)
            return Skip("the reference server computes ADD, MUL, SCALE, CPY, MUL_MAT and GET_ROWS "
                        "only; a llama graph also needs RMS_NORM, ROPE, SOFT_MAX and GLU")
        return ctx.model_client_unavailable()

    def run(self, ctx):
        result = ctx.run_model_client()
        if result.get("rejected"):
            return result["observation"]
        equal = result["equal"]
        checks = [Check("local and RPC text identical", equal,
                        f"local={result['local_text']!r} rpc={result['rpc_text']!r}")]
        if not equal:
            return Observation(FAILED, checks=checks, signature="model output differs over RPC")
        return Observation(WORKS, checks=checks, facts={"text": result["rpc_text"]})
