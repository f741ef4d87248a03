"""A tiny LD_PRELOAD shim that names a C server's fatal signal before it dies.

A GGML_ASSERT prints its line, but a SIGSEGV prints nothing, so every segfault of a target
would share one signature ("SIGSEGV", no log line) whatever its cause. The shim installs a
handler (on an alternate stack, so stack overflows are caught too) that writes one line::

    harness-fault: SIGSEGV null page in libggml-cpu.so+0x1a2b3 (ggml_vec_add_f32+0x23)

-- the signal, a coarse class (null page / stack overflow: fault address within 64 KiB of the
stack pointer / wild address / arithmetic), the module and offset of the faulting
instruction and the nearest exported symbol, and for a fault inside the C runtime (a
``strlen`` of a bad pointer) the first caller outside it (`` from libggml-base.so+0x.. (f+0x..)``)
-- then restores the default action and returns, so the instruction faults
again and the process still dies of the same signal (exit status unchanged).

Built once with the system C compiler into the harness cache; without a compiler the
targets simply run without it (crash signatures are then coarser, nothing else changes).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..impls.registry import cache_root

LINE_PREFIX = "harness-fault:"

SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

static char alt_stack[1 << 16];

#define LINE_MAX_BYTES 1000
#define SYMBOL_MAX_BYTES 200

static size_t put_at_most(char *out, size_t n, const char *s, size_t most) {
    size_t k = strnlen(s, most);
    if (n + k > LINE_MAX_BYTES) k = LINE_MAX_BYTES - n;
    memcpy(out + n, s, k);
    return n + k;
}

static size_t put(char *out, size_t n, const char *s) {
    return put_at_most(out, n, s, LINE_MAX_BYTES);
}

static size_t put_hex(char *out, size_t n, uintptr_t v) {
    char tmp[2 + 2 * sizeof v];
    size_t k = 0;
    do { tmp[k++] = "0123456789abcdef"[v & 15]; v >>= 4; } while (v && k < sizeof tmp);
    n = put(out, n, "0x");
    while (k && n < LINE_MAX_BYTES) out[n++] = tmp[--k];
    return n;
}

static size_t put_site(char *out, size_t n, uintptr_t ip, const Dl_info *info) {
    const char *base = strrchr(info->dli_fname, '/');
    n = put(out, n, base ? base + 1 : info->dli_fname);
    n = put(out, n, "+");
    n = put_hex(out, n, ip - (uintptr_t)info->dli_fbase);
    if (info->dli_sname) {  /* the nearest exported symbol, when there is one */
        n = put(out, n, " (");
        /* a mangled C++ name runs to hundreds of bytes: cut it, so the line still ends in
           its closing parenthesis and parses (a site is named by its first bytes anyway) */
        n = put_at_most(out, n, info->dli_sname, SYMBOL_MAX_BYTES);
        n = put(out, n, "+");
        n = put_hex(out, n, ip - (uintptr_t)info->dli_saddr);
        n = put(out, n, ")");
    }
    return n;
}

static int is_runtime(const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    return !strncmp(base, "libc.so", 7) || !strncmp(base, "libc-", 5)
        || !strncmp(base, "libstdc++", 9) || !strncmp(base, "libm.so", 7);
}

static void on_fault(int sig, siginfo_t *si, void *ctx) {
    ucontext_t *uc = (ucontext_t *)ctx;
    uintptr_t addr = (uintptr_t)si->si_addr, sp = 0, ip = 0;
#if defined(__x86_64__)
    sp = (uintptr_t)uc->uc_mcontext.gregs[REG_RSP];
    ip = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
    sp = (uintptr_t)uc->uc_mcontext.sp;
    ip = (uintptr_t)uc->uc_mcontext.pc;
#endif
    const char *name = sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS"
                     : sig == SIGFPE ? "SIGFPE" : "SIGILL";
    const char *kind = "wild address";
    if (sig == SIGFPE) kind = "arithmetic";
    else if (sig == SIGILL) kind = "illegal instruction";
    else if (addr < 65536) kind = "null page";
    else if (sp && addr + 65536 > sp && addr < sp + 65536) kind = "stack overflow";
    char buf[LINE_MAX_BYTES + 8];
    size_t n = put(buf, 0, "harness-fault: ");
    n = put(buf, n, name);
    n = put(buf, n, " ");
    n = put(buf, n, kind);
    Dl_info info;
    if (ip && dladdr((void *)ip, &info) && info.dli_fname) {
        n = put(buf, n, " in ");
        n = put_site(buf, n, ip, &info);
        if (is_runtime(info.dli_fname)) {
            /* a fault inside libc (strlen of a bad pointer) says nothing of whose pointer it
               was: name the first caller outside the runtime and this shim too */
            void *frames[32];
            int k = backtrace(frames, 32);
            Dl_info self, caller;
            dladdr((void *)on_fault, &self);
            for (int i = 0; i < k; i++) {
                uintptr_t pc = (uintptr_t)frames[i];
                if (!dladdr((void *)pc, &caller) || !caller.dli_fname) continue;
                if (caller.dli_fbase == self.dli_fbase || is_runtime(caller.dli_fname)) continue;
                n = put(buf, n, " from ");
                n = put_site(buf, n, pc, &caller);
                break;
            }
        }
    }
    buf[n++] = '\n';
    (void)!write(2, buf, n);
    /* SA_RESETHAND put the default action back: returning re-runs the faulting
       instruction and the process dies of the same signal. */
}

/* Every thread gets an alternate signal stack of its own: a server that serves each client
   on a thread (8.0.0) overflows that thread's stack, and without one the handler cannot run
   there, so the process died without a line. Freed when the thread ends. */
#define ALT_SIZE (1 << 16)
struct trampoline { void *(*fn)(void *); void *arg; };
static pthread_key_t alt_key;
static pthread_once_t alt_once = PTHREAD_ONCE_INIT;

static void alt_free(void *stack) {
    stack_t off;
    memset(&off, 0, sizeof off);
    off.ss_flags = SS_DISABLE;
    sigaltstack(&off, 0);
    free(stack);
}

static void alt_key_make(void) { pthread_key_create(&alt_key, alt_free); }

static void *with_alt_stack(void *p) {
    struct trampoline t = *(struct trampoline *)p;
    free(p);
    void *stack = malloc(ALT_SIZE);
    if (stack) {
        stack_t ss;
        memset(&ss, 0, sizeof ss);
        ss.ss_sp = stack;
        ss.ss_size = ALT_SIZE;
        if (sigaltstack(&ss, 0) == 0) {
            pthread_once(&alt_once, alt_key_make);
            pthread_setspecific(alt_key, stack);
        } else {
            free(stack);
        }
    }
    return t.fn(t.arg);
}

int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg) {
    static int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
    if (!real) real = dlsym(RTLD_NEXT, "pthread_create");
    struct trampoline *t = malloc(sizeof *t);
    if (!t) return real(th, attr, fn, arg);
    t->fn = fn;
    t->arg = arg;
    int rc = real(th, attr, with_alt_stack, t);
    if (rc != 0) free(t);
    return rc;
}

__attribute__((constructor)) static void harness_faultinfo_install(void) {
    void *warm[2];
    backtrace(warm, 2);  /* loads the unwinder now: the handler must not dlopen */
    stack_t ss;
    memset(&ss, 0, sizeof ss);
    ss.ss_sp = alt_stack;
    ss.ss_size = sizeof alt_stack;
    sigaltstack(&ss, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, 0);
    sigaction(SIGBUS, &sa, 0);
    sigaction(SIGFPE, &sa, 0);
    sigaction(SIGILL, &sa, 0);
}
"""

_built: dict[str, Path | None] = {}


def shim_path() -> Path | None:
    """The built shim (building it on first use), or None without a working C compiler."""
    key = hashlib.sha1(SOURCE.encode()).hexdigest()[:12]
    if key in _built:
        return _built[key]
    target = cache_root() / "fuzz" / f"faultinfo-{key}.so"
    if not target.exists():
        compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
        if compiler is None:
            _built[key] = None
            return None
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            src = Path(tmp) / "faultinfo.c"
            src.write_text(SOURCE)
            out = Path(tmp) / "faultinfo.so"
            try:
                subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(out), str(src),
                                "-ldl", "-lpthread"], check=True, capture_output=True,
                               timeout=120)
            except (OSError, subprocess.SubprocessError):
                _built[key] = None
                return None
            os.replace(out, target)  # atomic: concurrent workers may build it at once
    _built[key] = target
    return target


_SANITIZER_MARKS = (b"__asan_init", b"__ubsan_handle_", b"__msan_init", b"__tsan_init")


@functools.lru_cache(maxsize=64)  # asked at every restart of a target
def is_sanitized(binary: str | Path) -> bool:
    """Is ``binary`` (or a libggml next to it) built with a sanitizer? Then its runtime
    reports faults itself, far better than the shim, and must keep its own handlers."""
    path = Path(binary)
    for f in [path, *sorted(path.parent.glob("libggml*.so*"))]:
        try:
            with open(f, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        if any(mark in data for mark in _SANITIZER_MARKS):
            return True
    return False


def with_shim(env: dict[str, str], binary: str | Path | None = None) -> dict[str, str]:
    """``env`` with the shim preloaded (unchanged when it cannot be built, or when
    ``binary`` is a sanitizer build)."""
    if binary is not None and is_sanitized(binary):
        return env
    shim = shim_path()
    if shim is None:
        return env
    preload = env.get("LD_PRELOAD", "")
    return {**env, "LD_PRELOAD": f"{shim} {preload}".strip()}
