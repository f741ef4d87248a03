// LD_PRELOAD shim: register the RPC servers listed in $GGML_RPC_SERVERS (comma-separated
// host:port) as ggml backend devices before main() runs, so tools without an --rpc flag
// (llama-simple, test-backend-ops) offload to them exactly like `--rpc` does in
// common/arg.cpp (add_rpc_devices).
//
// Built per llama.cpp build by harness.impls.preload_shim.ensure_shim, linked against that
// build's libggml and libggml-rpc (so their constructors run first). The two functions it
// needs are declared here, so no headers are required; define RPC_PRELOAD_USE_HEADERS (and
// pass -I<ggml/include>) to check the declarations against a build's real headers.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef RPC_PRELOAD_USE_HEADERS
#include "ggml-backend.h"
#include "ggml-rpc.h"
#else
// Identical in ggml-backend.h / ggml-rpc.h of every supported version (proto 3.6.1 to 8.0.0).
typedef struct ggml_backend_reg * ggml_backend_reg_t;
ggml_backend_reg_t ggml_backend_rpc_add_server(const char * endpoint);
void ggml_backend_register(ggml_backend_reg_t reg);
#endif

__attribute__((constructor)) static void ggml_rpc_preload_init(void) {
    const char * s = getenv("GGML_RPC_SERVERS");
    if (!s || !*s) {
        return;
    }
    char * dup = strdup(s);
    char * save = NULL;
    for (char * tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        ggml_backend_reg_t reg = ggml_backend_rpc_add_server(tok);
        if (!reg) {
            // Exit code 3 tells the harness the shim, not the tool, refused to start.
            fprintf(stderr, "rpc_preload: cannot add %s\n", tok);
            exit(3);
        }
        ggml_backend_register(reg);
        fprintf(stderr, "rpc_preload: registered RPC server %s\n", tok);
    }
    free(dup);
}
