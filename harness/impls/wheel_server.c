/* The real ggml-rpc server loop from a directory of libggml*.so, without a server executable:
 * what harness/impls/wheel_server.py does, as a C program. A campaign restarts a server after
 * every crash it finds, thousands of times a sweep: started through Python, one restart of the
 * llama-cpp-py-sync wheel's server cost 31 ms of CPU, through this 5.
 *
 * usage: wheel_server LIBDIR HOST:PORT THREADS [CACHE_DIR]
 *
 * It loads libggml-base, libggml and libggml-rpc (globally, so they resolve each other), loads
 * the backends of a GGML_BACKEND_DL build, takes the CPU device and blocks in
 * ggml_backend_rpc_start_server; it returns only if the server gives up (a failed bind). */

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *load(const char *dir, const char *name) {
    char path[4096];
    const char *suffixes[] = {"", ".0"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s%s", dir, name, suffixes[i]);
        void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
        if (h) return h;
    }
    fprintf(stderr, "wheel_server: cannot load %s from %s: %s\n", name, dir, dlerror());
    exit(2);
}

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "wheel_server: no %s: %s\n", name, dlerror());
        exit(2);
    }
    return p;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 5) {
        fprintf(stderr, "usage: %s LIBDIR HOST:PORT THREADS [CACHE_DIR]\n", argv[0]);
        return 2;
    }
    /* the banner goes out with printf: line-buffered, it shows at once in a redirected log */
    setvbuf(stdout, NULL, _IOLBF, 0);
    load(argv[1], "libggml-base.so");
    void *ggml = load(argv[1], "libggml.so");
    void *rpc = load(argv[1], "libggml-rpc.so");

    void (*load_all)(void) = (void (*)(void))sym(ggml, "ggml_backend_load_all");
    void *(*dev_by_type)(int) = (void *(*)(int))sym(ggml, "ggml_backend_dev_by_type");
    void (*start)(const char *, const char *, size_t, size_t, void **) =
        (void (*)(const char *, const char *, size_t, size_t, void **))
            sym(rpc, "ggml_backend_rpc_start_server");

    load_all(); /* a no-op for builds with linked-in backends */
    void *cpu = dev_by_type(0 /* GGML_BACKEND_DEVICE_TYPE_CPU */);
    if (!cpu) {
        fprintf(stderr, "wheel_server: no CPU device in this ggml build\n");
        return 2;
    }
    void *devices[1] = {cpu};
    start(argv[2], argc == 5 ? argv[4] : NULL, (size_t)strtoul(argv[3], NULL, 10), 1, devices);
    fprintf(stderr, "server loop returned (bind failed?)\n");
    return 1;
}
