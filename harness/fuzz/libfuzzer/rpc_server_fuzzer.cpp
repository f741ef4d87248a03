// In-process libFuzzer target for a ggml-rpc server (the harness's own code).
//
// One input is one client connection: the byte stream a client would send (HELLO first, then
// request frames). The pin's own ggml-rpc.cpp is compiled into this translation unit (build.sh
// passes its path as HARNESS_RPC_SOURCE), so its static per-connection function
// rpc_serve_client() runs with the real CPU backend. The socket it reads is this file's own
// implementation of the pin's transport.h (the pin's transport.cpp is not built): recv_data()
// hands out the input's bytes, send_data() parses the answers, and the connection ends where
// the input ends.
//
// Buffer handles and bases are heap addresses that differ per run, so inputs carry the same
// sentinels as the Python harness's cases (harness/fuzz/case.py: 0x0AA5D... handles,
// 0x0BA5E... bases, buffer i at +i<<36, addend within 64 MiB): every such u64 is replaced,
// when the server reads it, by the value the server handed out on this connection for that
// buffer (ALLOC_BUFFER answers in order; BUFFER_GET_BASE answers for the handle asked) plus the
// same addend, or by the addend alone when it was never handed out. A seed generated with valid
// handles therefore reaches the server's deep paths on every run, as it does on the wire.

#include HARNESS_RPC_SOURCE

#include "ggml-cpu.h"

#include <cxxabi.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <new>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <typeinfo>
#include <unordered_set>
#include <vector>

namespace harness_fuzz {

constexpr uint64_t kSentinelHandle = 0x0AA5D00000000000ULL;
constexpr uint64_t kSentinelBase = 0x0BA5E00000000000ULL;
constexpr uint64_t kBufferSpacing = 1ULL << 36;
constexpr int64_t kRelocWindow = 1LL << 26;
constexpr uint64_t kMaxBuffers = 16;
constexpr size_t kAnswerKept = 16;  // the largest answer payload it learns from (ALLOC_BUFFER)

// HARNESS_FUZZ_TRACE=1: one line per command byte read, so a crash report says which
// request of the input was running (the Python driver names the finding after it).
static bool g_trace = false;

// HARNESS_FUZZ_PROFILE=path: where an execution's time goes, written to path at exit as one
// JSON object (harness/fuzz/libfuzzer/phase_clock.py reads it). A phase runs from one mark to the
// next: set-up (the input copied, the connection accepted, up to the first command byte), each
// request (its command byte read .. the next one: payload read, the server's work, its answer)
// and teardown (the input's end .. rpc_serve_client returned: the server's buffers freed).
// Relocation is counted apart as well, inside the requests it happens in.
enum ProfilePhase { kPhaseSetup = 256, kPhaseTeardown = 257, kPhaseCount = 258 };

struct Profile {
    const char * path = nullptr;
    unsigned long long executions = 0;
    unsigned long long ns[kPhaseCount] = {};
    unsigned long long count[kPhaseCount] = {};
    unsigned long long relocation_ns = 0;
    int phase = kPhaseSetup;
    unsigned long long mark = 0;
};
static Profile g_profile;

static unsigned long long now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

static void profile_enter(int phase) {
    if (g_profile.path == nullptr) {
        return;
    }
    unsigned long long t = now_ns();
    g_profile.ns[g_profile.phase] += t - g_profile.mark;
    g_profile.mark = t;
    g_profile.phase = phase;
    g_profile.count[phase] += 1;
}

static void profile_write() {
    FILE * f = fopen(g_profile.path, "w");
    if (f == nullptr) {
        return;
    }
    fprintf(f, "{\"format\": \"ggml-rpc-harness-fuzz-profile/1\", \"executions\": %llu, "
            "\"relocation_ns\": %llu, \"phases\": {", g_profile.executions,
            g_profile.relocation_ns);
    const char * sep = "";
    for (int i = 0; i < kPhaseCount; ++i) {
        if (g_profile.count[i] == 0) {
            continue;
        }
        char name[16];
        if (i == kPhaseSetup) {
            snprintf(name, sizeof name, "setup");
        } else if (i == kPhaseTeardown) {
            snprintf(name, sizeof name, "teardown");
        } else {
            snprintf(name, sizeof name, "%d", i);
        }
        fprintf(f, "%s\"%s\": [%llu, %llu]", sep, name, g_profile.count[i], g_profile.ns[i]);
        sep = ", ";
    }
    fprintf(f, "}}\n");
    fclose(f);
}

struct Connection {
    const uint8_t * original = nullptr;  // the input as libFuzzer gave it (before relocation)
    size_t original_size = 0;
    std::vector<uint8_t> input;
    size_t pos = 0;
    std::vector<uint64_t> handles;  // index: ALLOC_BUFFER answers in order
    std::vector<uint64_t> bases;    // index: the handle's
    std::vector<bool> base_known;
    int last_cmd = -1;
    unsigned long refused = 0;  // allocations the in-process cap refused (HARNESS_FUZZ_ALLOC_LIMIT)
    uint64_t last_u64 = 0;  // the last 8-byte read: a BUFFER_GET_BASE request's handle
    // Answer parser: an 8-byte size, then that many payload bytes.
    uint8_t head[8];
    size_t head_got = 0;
    uint64_t payload_left = 0;
    uint64_t payload_size = 0;
    uint8_t payload[kAnswerKept];
    size_t payload_got = 0;
    int answer_cmd = -1;

    uint64_t live(bool base, uint64_t index) const {
        if (base) {
            return index < bases.size() && base_known[index] ? bases[index] : 0;
        }
        return index < handles.size() ? handles[index] : 0;
    }

    // Where a sentinel u64 may start: found once per input with memchr for the 0xA5 tag byte
    // (byte 6 of both sentinels), so a read only looks at these, not at each of its bytes
    // (a per-byte scan of every read was half of an execution's time).
    std::vector<size_t> candidates;
    size_t next_candidate = 0;

    void find_candidates() {
        candidates.clear();
        next_candidate = 0;
        const uint8_t * base = input.data();
        size_t n = input.size();
        for (size_t at = 6; at < n;) {
            const void * hit = memchr(base + at, 0xA5, n - at);
            if (hit == nullptr) {
                break;
            }
            size_t p = (size_t)((const uint8_t *)hit - base);
            if (p + 1 < n && (base[p + 1] == 0x0A || base[p + 1] == 0x0B)) {
                candidates.push_back(p - 6);
            }
            at = p + 1;
        }
    }

    // Relocate every sentinel u64 that starts inside [from, to) (and ends inside the input),
    // from the left; the scan goes on after a patched u64, so the bytes patched in never
    // complete a sentinel of their own (as harness/fuzz/case.py find_relocs). Reads come in
    // order and patch only their own bytes, so the candidates found on the input as given
    // are those a scan of the bytes at read time would find.
    void relocate(size_t from, size_t to) {
        while (next_candidate < candidates.size() && candidates[next_candidate] < from) {
            ++next_candidate;
        }
        size_t skip_until = from;
        for (; next_candidate < candidates.size() && candidates[next_candidate] < to;
             ++next_candidate) {
            size_t s = candidates[next_candidate];
            if (s < skip_until || s + 8 > input.size()) {
                continue;
            }
            bool base = input[s + 7] == 0x0B;
            uint64_t v;
            memcpy(&v, &input[s], 8);
            uint64_t origin = base ? kSentinelBase : kSentinelHandle;
            // index = round((v - origin) / spacing), as harness/fuzz/case.py find_relocs
            int64_t rel = (int64_t)(v - origin);
            int64_t index = (rel + (int64_t)(kBufferSpacing / 2)) >> 36;
            int64_t addend = rel - index * (int64_t)kBufferSpacing;
            if (index < 0 || (uint64_t)index >= kMaxBuffers || addend <= -kRelocWindow ||
                addend >= kRelocWindow) {
                continue;
            }
            uint64_t patched = live(base, (uint64_t)index) + (uint64_t)addend;
            memcpy(&input[s], &patched, 8);
            if (g_trace) {
                fprintf(stderr, "harness-fuzz: relocated %s %lld at byte %zu\n",
                        base ? "base" : "handle", (long long)index, s);
            }
            skip_until = s + 8;
        }
    }

    bool read(void * data, size_t size) {
        if (size == 0) {
            return true;  // an empty payload (data may be null): nothing to read, like recv()
        }
        if (input.size() - pos < size) {
            pos = input.size();  // a short read: the client hung up mid-frame
            if (g_profile.phase != kPhaseTeardown) {
                profile_enter(kPhaseTeardown);
            }
            return false;
        }
        if (size >= 8) {
            unsigned long long t = g_profile.path != nullptr ? now_ns() : 0;
            relocate(pos, pos + size - 7);
            if (g_profile.path != nullptr) {
                g_profile.relocation_ns += now_ns() - t;
            }
        }
        memcpy(data, input.data() + pos, size);
        pos += size;
        if (size == 1) {
            last_cmd = ((const uint8_t *)data)[0];  // servers read the command byte alone
            profile_enter(last_cmd);
            if (g_trace) {
                fprintf(stderr, "harness-fuzz: command %d at byte %zu\n", last_cmd, pos - 1);
            }
        } else if (size == 8) {
            memcpy(&last_u64, data, 8);
        }
        return true;
    }

    void answer_done() {
        uint64_t v = 0;
        if (payload_got >= 8) {
            memcpy(&v, payload, 8);
        }
        if (answer_cmd == RPC_CMD_ALLOC_BUFFER && payload_size == 16) {
            handles.push_back(v);
        } else if (answer_cmd == RPC_CMD_BUFFER_GET_BASE && payload_size == 8) {
            for (size_t i = 0; i < handles.size(); ++i) {
                if (handles[i] == last_u64 && handles[i] != 0) {
                    if (bases.size() <= i) {
                        bases.resize(i + 1);
                        base_known.resize(i + 1);
                    }
                    bases[i] = v;
                    base_known[i] = true;
                }
            }
        }
    }

    void wrote(const uint8_t * data, size_t size) {
        while (size > 0) {
            if (payload_left == 0) {
                size_t n = std::min(size, sizeof head - head_got);
                memcpy(head + head_got, data, n);
                head_got += n;
                data += n;
                size -= n;
                if (head_got == sizeof head) {
                    head_got = 0;
                    memcpy(&payload_size, head, 8);
                    payload_left = payload_size;
                    payload_got = 0;
                    answer_cmd = last_cmd;
                    if (payload_left == 0) {
                        answer_done();
                    }
                }
                continue;
            }
            size_t n = (size_t)std::min<uint64_t>(size, payload_left);
            size_t keep = std::min(n, kAnswerKept - std::min(payload_got, kAnswerKept));
            memcpy(payload + payload_got, data, keep);
            payload_got += keep;
            payload_left -= n;
            data += n;
            size -= n;
            if (payload_left == 0) {
                answer_done();
            }
        }
    }
};

static Connection * g_next = nullptr;  // the connection socket_t::accept() hands out next

}  // namespace harness_fuzz

// ---- findings the process survives: GGML_ASSERT / GGML_ABORT, uncaught exceptions
//
// A real server aborts on a failed GGML_ASSERT. Here the abort callback records the abort (an
// event: the message and the request that was running, and the input) and unwinds back to
// LLVMFuzzerTestOneInput with an exception, so one shallow assert does not end every fuzzing
// job (a sanitizer error still ends the process: memory is suspect then).
// HARNESS_FUZZ_ABORT=1 restores the server's behaviour (abort), e.g. to reproduce a finding.
// The event's offset is the server's read position (the byte after the last one it read).
//
// Events go to HARNESS_FUZZ_EVENTS=dir. An abort the process survives is written once per
// campaign for each (request, message), as <dir>/a-<hash>.event and .input, the name claimed
// with O_EXCL: every fork-mode job meets the same shallow asserts within seconds, and each job
// writing them again was a few percent of the campaign in file creation. A report the process
// dies of is written each time, as <dir>/<pid>-<n>.event and .input (one per process).

namespace harness_fuzz {

struct Aborted {};

static Connection * g_running = nullptr;
static const char * g_events = nullptr;
static bool g_abort = false;
static const char * g_abort_only = nullptr;
static std::unordered_set<std::string> * g_seen = nullptr;
static unsigned long g_event_no = 0;

static void write_event_files(const char * stem, bool claim, const char * kind,
                              const char * text) {
    char event[4096];
    char input[4096];
    snprintf(event, sizeof event, "%s/%s.event", g_events, stem);
    snprintf(input, sizeof input, "%s/%s.input", g_events, stem);
    FILE * ev = fopen(event, claim ? "wx" : "w");
    if (ev == nullptr) {
        return;  // claimed by another job already
    }
    if (FILE * f = fopen(input, "wb")) {
        fwrite(g_running->original, 1, g_running->original_size, f);
        fclose(f);
    }
    fprintf(ev, "kind: %s\ncommand: %d\noffset: %zu\nlength: %zu\ncapped: %lu\n\n%s\n", kind,
            g_running->last_cmd, g_running->pos, g_running->original_size, g_running->refused,
            text);
    fclose(ev);
}

static void write_event(const char * kind, const char * text) {
    if (g_events == nullptr || g_running == nullptr) {
        return;
    }
    char stem[64];
    snprintf(stem, sizeof stem, "%d-%lu", (int)getpid(), g_event_no++);
    write_event_files(stem, false, kind, text);
}

// An abort or exception the process survives (or an allocation the cap refused): once per
// (request, message) in this process, and once in the campaign (the O_EXCL claim of a name
// hashed from both; a refused allocation's size is not part of its message).
static void record_survived(const char * text, const char * kind) {
    if (g_events == nullptr || g_running == nullptr) {
        return;
    }
    std::string key = std::to_string(g_running->last_cmd) + '\n' + kind + '\n' +
                      (strcmp(kind, "capped") == 0 ? "" : text);
    if (g_seen == nullptr) {
        g_seen = new std::unordered_set<std::string>();
    }
    if (!g_seen->insert(key).second) {
        return;
    }
    uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
    for (unsigned char c : key) {
        h = (h ^ c) * 0x100000001b3ULL;
    }
    char stem[64];
    snprintf(stem, sizeof stem, "a-%016llx", (unsigned long long)h);
    write_event_files(stem, true, kind, text);
}

// Does this abort / uncaught exception end the process? With HARNESS_FUZZ_ABORT, yes; with
// HARNESS_FUZZ_ABORT_ONLY=text, only when its message contains the text (so libFuzzer's
// -minimize_crash keeps the finding's own failure, not any other one on the way).
static bool fatal(const char * message) {
    if (g_abort_only != nullptr) {
        return strstr(message, g_abort_only) != nullptr;
    }
    return g_abort;
}

static void on_abort(const char * message) {
    if (g_running == nullptr || fatal(message)) {
        fprintf(stderr, "%s\n", message);  // the death line, as the server prints it
        abort();
    }
    record_survived(message, "abort");  // the event says it; printing each was a write each
    throw Aborted();
}

static void on_exception(const char * text) {
    record_survived(text, "abort");
}

#if defined(__has_feature)
#  if __has_feature(address_sanitizer)
#    define HARNESS_ASAN 1
#  endif
#endif

// HARNESS_FUZZ_ALLOC_LIMIT=bytes: while an input runs, a server allocation above it fails as
// one above the address-space limit does (null, ENOMEM, std::bad_alloc). Under ASan an
// allocation of S bytes costs about S/8 bytes of shadow written and page-faulted twice (poisoned
// when mapped and when freed), so a 1 GiB ALLOC_BUFFER costs thousands of ordinary executions
// and its mutants kept the fuzzer busy; the code a larger buffer reaches is the same. The driver
// confirms every finding without the cap (engine.py), so the cap decides only where the
// fuzzer's time goes. Unset (ClusterFuzzLite, the coverage build): no cap.
//
// What the cap would hide is memory volume. One kind the server always touches: a receive
// buffer or array (operator new here: std::vector resize and new[]() zero-fill it) as large as
// a request announces. Refused while the uncapped server would have allocated it
// (HARNESS_FUZZ_RSS_BOUND < size <= HARNESS_FUZZ_AS_LIMIT), it is recorded as an event of kind
// "capped", once per request in the campaign, and the driver re-runs it without the cap: the
// resident memory finding it was. A large ggml buffer is only touched if a later request does
// (BUFFER_CLEAR): that volume is the live engine's to judge (its RSS bound, its amplification
// oracle), where such a buffer costs nothing until touched.
static size_t g_alloc_limit = 0;
static size_t g_rss_bound = 0;
static size_t g_as_limit = 0;

static bool refuse_allocation(size_t size, bool touched) {
    if (g_alloc_limit == 0 || g_running == nullptr || size <= g_alloc_limit) {
        return false;
    }
    g_running->refused += 1;
    if (touched && g_rss_bound != 0 && size > g_rss_bound && size <= g_as_limit) {
        char text[160];
        snprintf(text, sizeof text, "allocation above the resident memory bound refused by "
                 "the in-process cap: %zu bytes", size);
        record_survived(text, "capped");
    }
    return true;
}

#ifdef HARNESS_ASAN
static void on_asan_report(const char * report) {
    write_event("sanitizer", report);  // the process dies right after: one per process
}
#endif

}  // namespace harness_fuzz

// UBSan's report hook (a weak no-op in its runtime): the report the process is about to die of,
// as an event of kind "ubsan" holding UBSan's first line. The campaign runs UBSan without its
// stack trace (print_stacktrace=0: symbolizing it took a fifth of a second at every death, and
// most deaths are a handful of shallow UBSan reports met again and again); the driver re-runs
// one input per report line with the stack trace to name the finding.
extern "C" void __ubsan_get_current_report_data(const char ** kind, const char ** message,
                                                const char ** filename, unsigned * line,
                                                unsigned * col, char ** address)
    __attribute__((weak));

extern "C" void __ubsan_on_report() {
    if (__ubsan_get_current_report_data == nullptr) {
        return;
    }
    const char * kind = nullptr;
    const char * message = nullptr;
    const char * filename = nullptr;
    unsigned line = 0;
    unsigned col = 0;
    char * address = nullptr;
    __ubsan_get_current_report_data(&kind, &message, &filename, &line, &col, &address);
    char text[2048];
    snprintf(text, sizeof text, "%s:%u:%u: runtime error: %s", filename ? filename : "<unknown>",
             line, col, message ? message : "");
    harness_fuzz::write_event("ubsan", text);
}

#ifdef HARNESS_ASAN
extern "C" void __asan_set_error_report_callback(void (*callback)(const char *));
#endif

// ---- allocation failures as the real server sees them
//
// ASan's operator new reports an out-of-memory error where the server's own build throws
// std::bad_alloc (which recv_msg catches: a huge length prefix is refused, not fatal). With
// allocator_may_return_null=1 (the driver sets it) malloc returns null instead, and these make
// new throw as it does without ASan. (ASan's new/delete mismatch check is given up for it.)
#ifdef HARNESS_ASAN
static void * harness_alloc(size_t n, size_t align) {
    if (harness_fuzz::refuse_allocation(n, true)) {
        return nullptr;
    }
    void * p = nullptr;
    if (align > alignof(std::max_align_t)) {
        if (posix_memalign(&p, align, n ? n : 1) != 0) {
            p = nullptr;
        }
    } else {
        p = malloc(n ? n : 1);
    }
    return p;
}
void * operator new(size_t n) {
    if (void * p = harness_alloc(n, 0)) return p;
    throw std::bad_alloc();
}
void * operator new[](size_t n) {
    if (void * p = harness_alloc(n, 0)) return p;
    throw std::bad_alloc();
}
void * operator new(size_t n, std::align_val_t a) {
    if (void * p = harness_alloc(n, (size_t)a)) return p;
    throw std::bad_alloc();
}
void * operator new[](size_t n, std::align_val_t a) {
    if (void * p = harness_alloc(n, (size_t)a)) return p;
    throw std::bad_alloc();
}
void * operator new(size_t n, const std::nothrow_t &) noexcept { return harness_alloc(n, 0); }
void * operator new[](size_t n, const std::nothrow_t &) noexcept { return harness_alloc(n, 0); }
// ggml's buffers and contexts come from posix_memalign: ASan's interceptor is a weak symbol,
// this one wraps it with the cap.
extern "C" int __interceptor_posix_memalign(void ** memptr, size_t alignment, size_t size);
extern "C" int posix_memalign(void ** memptr, size_t alignment, size_t size) noexcept {
    if (harness_fuzz::refuse_allocation(size, false)) {
        return ENOMEM;
    }
    return __interceptor_posix_memalign(memptr, alignment, size);
}
void operator delete(void * p) noexcept { free(p); }
void operator delete[](void * p) noexcept { free(p); }
void operator delete(void * p, size_t) noexcept { free(p); }
void operator delete[](void * p, size_t) noexcept { free(p); }
void operator delete(void * p, std::align_val_t) noexcept { free(p); }
void operator delete[](void * p, std::align_val_t) noexcept { free(p); }
void operator delete(void * p, size_t, std::align_val_t) noexcept { free(p); }
void operator delete[](void * p, size_t, std::align_val_t) noexcept { free(p); }
void operator delete(void * p, const std::nothrow_t &) noexcept { free(p); }
void operator delete[](void * p, const std::nothrow_t &) noexcept { free(p); }
#endif

// ---- the pin's transport.h, implemented over one in-memory connection

struct socket_t::impl {
    harness_fuzz::Connection * conn = nullptr;
};

socket_t::socket_t(std::unique_ptr<impl> p) : pimpl(std::move(p)) {}
socket_t::~socket_t() = default;

bool socket_t::send_data(const void * data, size_t size) {
    pimpl->conn->wrote(static_cast<const uint8_t *>(data), size);
    return true;
}

bool socket_t::recv_data(void * data, size_t size) {
    return pimpl->conn->read(data, size);
}

#ifdef HARNESS_TRANSPORT_FLUSH
bool socket_t::flush() {
    return true;
}
#endif

socket_ptr socket_t::accept() {
    auto p = std::make_unique<impl>();
    p->conn = harness_fuzz::g_next;
    return socket_ptr(new socket_t(std::move(p)));
}

void socket_t::get_caps(uint8_t * local_caps) {
    memset(local_caps, 0, RPC_CONN_CAPS_SIZE);  // TCP only: no transport upgrade on offer
}

void socket_t::update_caps(const uint8_t * remote_caps) {
    (void)remote_caps;
}

socket_ptr socket_t::create_server(const char * host, int port) {
    (void)host;
    (void)port;
    return socket_ptr(new socket_t(std::make_unique<impl>()));
}

socket_ptr socket_t::connect(const char * host, int port) {
    (void)host;
    (void)port;
    return nullptr;  // the server side never connects out
}

bool rpc_transport_init() {
    return true;
}

void rpc_transport_shutdown() {}

// ---- libFuzzer entry points

static std::vector<ggml_backend_t> * g_backends = nullptr;
static const char * g_cache_dir = nullptr;

static void quiet_log(enum ggml_log_level level, const char * text, void * user) {
    (void)level;
    (void)text;
    (void)user;
}

extern "C" int LLVMFuzzerInitialize(int * argc, char *** argv) {
    (void)argc;
    (void)argv;
    setenv("GGML_NO_BACKTRACE", "1", 0);  // ggml would run gdb on every abort
    if (!getenv("HARNESS_FUZZ_VERBOSE")) {
        ggml_log_set(quiet_log, nullptr);  // refusals are the normal case: do not print each
    }
    harness_fuzz::g_trace = getenv("HARNESS_FUZZ_TRACE") != nullptr;
    g_cache_dir = getenv("HARNESS_FUZZ_CACHE_DIR");
    harness_fuzz::g_events = getenv("HARNESS_FUZZ_EVENTS");
    harness_fuzz::g_profile.path = getenv("HARNESS_FUZZ_PROFILE");
    if (harness_fuzz::g_profile.path != nullptr) {
        atexit(harness_fuzz::profile_write);
    }
    if (const char * limit = getenv("HARNESS_FUZZ_ALLOC_LIMIT")) {
        harness_fuzz::g_alloc_limit = (size_t)strtoull(limit, nullptr, 10);
    }
    if (const char * bound = getenv("HARNESS_FUZZ_RSS_BOUND")) {
        harness_fuzz::g_rss_bound = (size_t)strtoull(bound, nullptr, 10);
    }
    if (const char * limit = getenv("HARNESS_FUZZ_AS_LIMIT")) {
        harness_fuzz::g_as_limit = (size_t)strtoull(limit, nullptr, 10);
    }
    harness_fuzz::g_abort = getenv("HARNESS_FUZZ_ABORT") != nullptr;
    harness_fuzz::g_abort_only = getenv("HARNESS_FUZZ_ABORT_ONLY");
    ggml_set_abort_callback(harness_fuzz::on_abort);
#ifdef HARNESS_ASAN
    __asan_set_error_report_callback(harness_fuzz::on_asan_report);
#endif  // the server's -c; unset: no cache
    ggml_backend_t cpu = ggml_backend_cpu_init();
    if (cpu == nullptr) {
        fprintf(stderr, "harness fuzzer: cannot create the CPU backend\n");
        abort();
    }
    ggml_backend_cpu_set_n_threads(cpu, 1);  // the harness's servers run with -t 1
    g_backends = new std::vector<ggml_backend_t>{cpu};
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    harness_fuzz::Profile & profile = harness_fuzz::g_profile;
    if (profile.path != nullptr) {
        profile.executions += 1;
        profile.mark = harness_fuzz::now_ns();
        profile.phase = harness_fuzz::kPhaseSetup;
        profile.count[harness_fuzz::kPhaseSetup] += 1;
    }
    harness_fuzz::Connection conn;
    conn.original = data;
    conn.original_size = size;
    conn.input.assign(data, data + size);
    conn.find_candidates();
    harness_fuzz::g_next = &conn;
    harness_fuzz::g_running = &conn;
    static socket_ptr listener = socket_t::create_server("127.0.0.1", 0);
    try {
        rpc_serve_client(*g_backends, g_cache_dir, listener->accept());
    } catch (const harness_fuzz::Aborted &) {
        // The server would have died here; the event is recorded, the fuzzer goes on.
    } catch (const std::exception & e) {
        // Uncaught by the server: its process would end in std::terminate. Recorded with
        // the line the C++ runtime prints then, so it is named like a live server's death.
        int status = 0;
        char * name = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
        std::string line = std::string("terminate called after throwing an instance of '") +
                           (status == 0 && name ? name : typeid(e).name()) + "'\n  what():  " +
                           e.what();
        free(name);
        if (harness_fuzz::fatal(line.c_str())) {
            throw;  // to std::terminate, as in the server
        }
        harness_fuzz::on_exception(line.c_str());
    }
    if (profile.path != nullptr) {  // the phase running when the server returned ends here
        unsigned long long t = harness_fuzz::now_ns();
        profile.ns[profile.phase] += t - profile.mark;
        profile.mark = t;
    }
    harness_fuzz::g_next = nullptr;
    harness_fuzz::g_running = nullptr;
    return 0;
}
