// LD_PRELOAD shim: a bind() to the wildcard address binds to loopback instead.
//
// The real 8.0.0 server's rank-0 COMM_INIT listens on 0.0.0.0 (every interface); the harness
// may only listen on 127.0.0.1. Preloaded into real server processes (never the harness
// itself) by harness.impls.loopback.ensure_loopback_shim; each rewrite is logged on stderr so
// a run shows it happened. Addresses other than INADDR_ANY / in6addr_any pass unchanged.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

// A named symbol so the library is recognisable; the harness proves it is loaded from
// /proc/PID/maps before it lets a real server open a communicator.
const char loopback_bind_marker[] = "ggml-rpc-harness loopback_bind";

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real_bind;
    if (!real_bind) {
        real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    }
    if (addr && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in in4;
        memcpy(&in4, addr, sizeof in4);
        if (in4.sin_addr.s_addr == htonl(INADDR_ANY)) {
            in4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            fprintf(stderr, "[loopback_bind] 0.0.0.0:%u -> 127.0.0.1:%u\n",
                    ntohs(in4.sin_port), ntohs(in4.sin_port));
            return real_bind(fd, (const struct sockaddr *)&in4, sizeof in4);
        }
    } else if (addr && addr->sa_family == AF_INET6 &&
               len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 in6;
        memcpy(&in6, addr, sizeof in6);
        if (memcmp(&in6.sin6_addr, &in6addr_any, sizeof in6addr_any) == 0) {
            in6.sin6_addr = in6addr_loopback;
            fprintf(stderr, "[loopback_bind] [::]:%u -> [::1]:%u\n",
                    ntohs(in6.sin6_port), ntohs(in6.sin6_port));
            return real_bind(fd, (const struct sockaddr *)&in6, sizeof in6);
        }
    }
    return real_bind(fd, addr, len);
}
