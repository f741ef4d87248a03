/*
 * softverbs: a software RDMA device behind the libibverbs API, for machines without an HCA.
 *
 * Built as libibverbs.so.1 (same soname and symbol versions as rdma-core's) and loaded in its
 * place through LD_LIBRARY_PATH for the processes under test only. One device, "softverbs0",
 * one port, RoCE-shaped GIDs for the IPv4 addresses in $SOFTVERBS_ADDRS (default 127.0.0.1).
 *
 * Reliable-connected SEND/RECV between processes of this machine: every QP listens on an
 * abstract Unix socket named after its QPN (which also makes QPNs unique machine-wide); the
 * requester connects to the QPN its peer advertised. Per message the requester sends REQ
 * (psn, length); the responder answers from its receive queue as an HCA would:
 *   head RECV fits        -> CTS, the data lands in that one RECV, ACK -> both complete SUCCESS
 *   no RECV posted        -> RNR NAK; the requester waits min_rnr_timer and asks again
 *                            (rnr_retry 7 = forever, else RNR_RETRY_EXC_ERR when exhausted)
 *   head RECV too small   -> responder LOC_LEN_ERR, requester REM_INV_REQ_ERR, both QPs error
 *   RECV SGE not writable -> responder LOC_PROT_ERR, requester REM_OP_ERR, both QPs error
 *   not RTR / wrong QPN or PSN / no such QP -> silence; the requester retries every `timeout`
 *                            and gives up with RETRY_EXC_ERR after retry_cnt retries.
 * Two threads per QP do the "hardware" work: a requester thread drains the send queue one
 * message at a time (in order), a responder thread serves the incoming connection. Each uses
 * blocking I/O on its own socket only, so two QPs sending to each other cannot deadlock.
 *
 * $SOFTVERBS_STATS_DIR: each QP keeps <dir>/qp-<pid>-<qpn>.json up to date (counters), so a
 * test can prove the payload went over this device. $SOFTVERBS_LOG=1: state changes on stderr.
 * $SOFTVERBS_MEMLOCK: byte limit on registered memory per process (as RLIMIT_MEMLOCK would be
 * for an unprivileged user), to exercise registration failures.
 * $SOFTVERBS_CAPTURE_DIR: each QP appends every SEND it received to <dir>/rx-<pid>-<qpn>.bin as
 * records <f64 CLOCK_REALTIME seconds><u32 length><data>: the device's packet capture, since no
 * TCP proxy sees what crosses a queue pair.
 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>

#include <errno.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define SV_EXPORT __attribute__((visibility("default")))
#define SV_DEV_NAME "softverbs0"
#define SV_MAX_ADDRS 4
#define SV_GID_TBL_LEN 16
#define SV_MAX_WR 16384
#define SV_MAX_SGE 32
#define SV_MAX_CQE 65536
#define SV_MAX_INLINE 256
#define SV_MAX_MSG (1u << 31)
#define SV_SPIN_POLLS 256 /* empty polls in a row before a poller naps */
#define SV_POLL_NAP_NS 20000
#define SV_SOCK_PREFIX "softverbs/qp/"
#define SV_STATE_NAMES {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}

/* ---------------------------------------------------------------- device, GIDs */

struct sv_gid { union ibv_gid gid; enum ibv_gid_type type; };

static struct ibv_device sv_device;
static struct sv_gid sv_gids[SV_GID_TBL_LEN];
static int sv_ngids;
static pthread_once_t sv_once = PTHREAD_ONCE_INIT;
static int sv_log_on;
static const char *sv_stats_dir;
static const char *sv_capture_dir;
static long long sv_memlock = -1;
static atomic_llong sv_registered;

static void sv_log(const char *fmt, ...) {
    if (!sv_log_on) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "softverbs[%d]: ", (int)getpid());
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void sv_add_gid(const uint8_t raw[16], enum ibv_gid_type type) {
    if (sv_ngids >= SV_GID_TBL_LEN) return;
    memcpy(sv_gids[sv_ngids].gid.raw, raw, 16);
    sv_gids[sv_ngids].type = type;
    sv_ngids++;
}

/* The table rxe builds: a link-local GID, then per IPv4 address ::ffff:a.b.c.d as RoCE v1
 * and v2 (so the probes' "prefer v2" rule has a choice to make). */
static void sv_init(void) {
    sv_log_on = getenv("SOFTVERBS_LOG") && *getenv("SOFTVERBS_LOG") && strcmp(getenv("SOFTVERBS_LOG"), "0");
    sv_stats_dir = getenv("SOFTVERBS_STATS_DIR");
    if (sv_stats_dir && !*sv_stats_dir) sv_stats_dir = NULL;
    sv_capture_dir = getenv("SOFTVERBS_CAPTURE_DIR");
    if (sv_capture_dir && !*sv_capture_dir) sv_capture_dir = NULL;
    if (getenv("SOFTVERBS_MEMLOCK")) sv_memlock = atoll(getenv("SOFTVERBS_MEMLOCK"));

    memset(&sv_device, 0, sizeof(sv_device));
    sv_device.node_type = IBV_NODE_CA;
    sv_device.transport_type = IBV_TRANSPORT_IB;
    snprintf(sv_device.name, sizeof(sv_device.name), "%s", SV_DEV_NAME);
    snprintf(sv_device.dev_name, sizeof(sv_device.dev_name), "uverbs0");
    snprintf(sv_device.dev_path, sizeof(sv_device.dev_path), "/dev/null");
    snprintf(sv_device.ibdev_path, sizeof(sv_device.ibdev_path), "/dev/null");

    uint8_t ll[16] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x00, 0x5e, 0xff, 0xfe, 0x50, 0x56, 0x01};
    sv_add_gid(ll, IBV_GID_TYPE_ROCE_V1);
    sv_add_gid(ll, IBV_GID_TYPE_ROCE_V2);
    const char *addrs = getenv("SOFTVERBS_ADDRS");
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", addrs && *addrs ? addrs : "127.0.0.1");
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && n < SV_MAX_ADDRS;
         tok = strtok_r(NULL, ",", &save), n++) {
        uint8_t g[16] = {0};
        g[10] = g[11] = 0xff;
        if (inet_pton(AF_INET, tok, &g[12]) != 1) {
            fprintf(stderr, "softverbs: SOFTVERBS_ADDRS: %s is not an IPv4 address\n", tok);
            continue;
        }
        sv_add_gid(g, IBV_GID_TYPE_ROCE_V1);
        sv_add_gid(g, IBV_GID_TYPE_ROCE_V2);
    }
}

static int sv_is_local_gid(const uint8_t raw[16]) {
    for (int i = 0; i < sv_ngids; i++)
        if (!memcmp(sv_gids[i].gid.raw, raw, 16)) return 1;
    return 0;
}

/* ---------------------------------------------------------------- objects */

struct sv_mr {
    struct ibv_mr mr;
    unsigned access;
    struct sv_mr *next;
};

struct sv_pd {
    struct ibv_pd pd;
    pthread_mutex_t lock;
    struct sv_mr *mrs;
};

struct sv_channel {
    struct ibv_comp_channel ch;
    int wfd;
    pthread_mutex_t lock;
    struct ibv_cq **queue; /* CQs with an event not yet taken by ibv_get_cq_event */
    int qlen, qcap;
};

struct sv_cq {
    struct ibv_cq cq;
    pthread_mutex_t lock;
    struct ibv_wc *ring;
    int head, count, cap;
    int armed;
    int overrun;
    unsigned events_reported;
    unsigned empty_polls; /* in a row: a poller spinning on this CQ */
};

struct sv_wr {
    uint64_t wr_id;
    int signaled;
    int num_sge;
    struct ibv_sge sge[SV_MAX_SGE];
    uint8_t *inline_data; /* owned copy for IBV_SEND_INLINE */
    uint32_t length;
};

struct sv_queue { struct sv_wr *wr; int head, count, cap; };

struct sv_stats {
    unsigned long long sends, send_bytes, recvs, recv_bytes;
    unsigned long long rnr_naks_sent, rnr_naks_received, retries, errors, max_send;
    unsigned long long inline_sends;
    /* most send WRs posted and not yet completed (1: stop-and-wait), most receive WRs posted */
    unsigned long long max_send_queue, max_recv_queue;
};

struct sv_qp {
    struct ibv_qp qp;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct sv_queue sq, rq;
    struct ibv_qp_cap cap;
    int sq_sig_all;
    /* attributes */
    uint8_t port_num, timeout, retry_cnt, rnr_retry, min_rnr_timer;
    enum ibv_mtu path_mtu;
    uint32_t dest_qpn, rq_psn, sq_psn;
    unsigned access_flags;
    struct ibv_ah_attr ah;
    uint16_t pkey_index;
    uint8_t max_rd_atomic, max_dest_rd_atomic;
    /* wire */
    int listen_fd, in_fd, out_fd, wake_fd;
    int stopping;
    pthread_t req_thread, resp_thread;
    struct sv_stats st;
    int stats_fd;
    int capture_fd;
};

static struct sv_pd *to_pd(struct ibv_pd *p) { return (struct sv_pd *)p; }
static struct sv_cq *to_cq(struct ibv_cq *c) { return (struct sv_cq *)c; }
static struct sv_qp *to_qp(struct ibv_qp *q) { return (struct sv_qp *)q; }

static struct ibv_context_ops sv_ops;

/* ---------------------------------------------------------------- device list and context */

SV_EXPORT struct ibv_device **ibv_get_device_list(int *num_devices) {
    pthread_once(&sv_once, sv_init);
    struct ibv_device **list = calloc(2, sizeof(*list));
    if (!list) { errno = ENOMEM; return NULL; }
    list[0] = &sv_device;
    if (num_devices) *num_devices = 1;
    return list;
}

SV_EXPORT void ibv_free_device_list(struct ibv_device **list) { free(list); }
SV_EXPORT const char *ibv_get_device_name(struct ibv_device *device) { return device->name; }
SV_EXPORT __be64 ibv_get_device_guid(struct ibv_device *device) {
    (void)device;
    return htobe64(0x02005efffe505601ULL);
}
SV_EXPORT int ibv_get_device_index(struct ibv_device *device) { (void)device; return 0; }

SV_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device) {
    pthread_once(&sv_once, sv_init);
    if (device != &sv_device) { errno = ENODEV; return NULL; }
    struct ibv_context *ctx = calloc(1, sizeof(*ctx));
    if (!ctx) { errno = ENOMEM; return NULL; }
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) { free(ctx); return NULL; }
    ctx->device = device;
    ctx->ops = sv_ops;
    ctx->cmd_fd = p[0];     /* a real fd, as callers may poll or close it */
    ctx->async_fd = p[1];   /* no async events are ever produced */
    ctx->num_comp_vectors = 1;
    pthread_mutex_init(&ctx->mutex, NULL);
    ctx->abi_compat = NULL; /* not a verbs_context: the header's inline _ex paths fall back */
    return ctx;
}

SV_EXPORT int ibv_close_device(struct ibv_context *ctx) {
    close(ctx->cmd_fd);
    close(ctx->async_fd);
    pthread_mutex_destroy(&ctx->mutex);
    free(ctx);
    return 0;
}

SV_EXPORT int ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *a) {
    memset(a, 0, sizeof(*a));
    snprintf(a->fw_ver, sizeof(a->fw_ver), "softverbs 1");
    a->node_guid = ibv_get_device_guid(ctx->device);
    a->sys_image_guid = a->node_guid;
    a->max_mr_size = ~0ULL;
    a->page_size_cap = 4096;
    a->vendor_id = 0xffffff;
    a->hw_ver = 1;
    a->max_qp = 1 << 16;
    a->max_qp_wr = SV_MAX_WR;
    a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN;
    a->max_sge = SV_MAX_SGE;
    a->max_cq = 1 << 16;
    a->max_cqe = SV_MAX_CQE;
    a->max_mr = 1 << 16;
    a->max_pd = 1 << 16;
    a->max_qp_rd_atom = 1;
    a->max_qp_init_rd_atom = 1;
    a->max_res_rd_atom = 1;
    a->atomic_cap = IBV_ATOMIC_NONE;
    a->max_pkeys = 1;
    a->phys_port_cnt = 1;
    return 0;
}

/* rdma-core 44 ABI: ibv_query_port takes the compat struct; the header's inline wrapper
 * zeroes the full struct and passes it here when the context is not extended. */
SV_EXPORT int (ibv_query_port)(struct ibv_context *ctx, uint8_t port, struct _compat_ibv_port_attr *pa) {
    (void)ctx;
    if (port != 1) return EINVAL;
    struct ibv_port_attr *a = (struct ibv_port_attr *)pa;
    a->state = IBV_PORT_ACTIVE;
    a->max_mtu = IBV_MTU_4096;
    a->active_mtu = IBV_MTU_1024; /* what rxe reports over a 1500-byte Ethernet MTU */
    a->gid_tbl_len = SV_GID_TBL_LEN;
    a->port_cap_flags = IBV_PORT_CM_SUP;
    a->max_msg_sz = SV_MAX_MSG;
    a->pkey_tbl_len = 1;
    a->active_width = 1;  /* 1x */
    a->active_speed = 32; /* 25 Gb/s */
    a->phys_state = 5;    /* LinkUp */
    a->link_layer = IBV_LINK_LAYER_ETHERNET;
    return 0;
}

SV_EXPORT int ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid) {
    (void)ctx;
    pthread_once(&sv_once, sv_init);
    if (port != 1 || index < 0 || index >= SV_GID_TBL_LEN) return -1;
    memset(gid, 0, sizeof(*gid));
    if (index < sv_ngids) *gid = sv_gids[index].gid;
    return 0;
}

SV_EXPORT int _ibv_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index,
                                struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size) {
    (void)ctx;
    pthread_once(&sv_once, sv_init);
    if (flags || entry_size < sizeof(*entry)) return EINVAL;
    if (port != 1 || index >= SV_GID_TBL_LEN) return EINVAL;
    if (index >= (uint32_t)sv_ngids) return ENODATA; /* an empty slot, as the kernel says */
    memset(entry, 0, sizeof(*entry));
    entry->gid = sv_gids[index].gid;
    entry->gid_index = index;
    entry->port_num = port;
    entry->gid_type = sv_gids[index].type;
    return 0;
}

SV_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *entries,
                                       size_t max_entries, uint32_t flags, size_t entry_size) {
    pthread_once(&sv_once, sv_init);
    if (flags || entry_size < sizeof(*entries)) return -EINVAL;
    size_t n = 0;
    for (int i = 0; i < sv_ngids && n < max_entries; i++, n++)
        _ibv_query_gid_ex(ctx, 1, i, &entries[n], 0, sizeof(*entries));
    return (ssize_t)n;
}

/* rdma-core's private ibv_query_gid_type: 0 = IB/RoCE v1, 1 = RoCE v2 (sysfs values). */
SV_EXPORT int ibv_query_gid_type(struct ibv_context *ctx, uint8_t port, unsigned int index, int *type) {
    struct ibv_gid_entry e;
    int rc = _ibv_query_gid_ex(ctx, port, index, &e, 0, sizeof(e));
    if (rc) { errno = rc; return -1; }
    *type = e.gid_type == IBV_GID_TYPE_ROCE_V2 ? 1 : 0;
    return 0;
}

SV_EXPORT int ibv_query_pkey(struct ibv_context *ctx, uint8_t port, int index, __be16 *pkey) {
    (void)ctx;
    if (port != 1 || index != 0) return -1;
    *pkey = htobe16(0xffff);
    return 0;
}

SV_EXPORT int ibv_get_pkey_index(struct ibv_context *ctx, uint8_t port, __be16 pkey) {
    (void)ctx;
    return port == 1 && be16toh(pkey) == 0xffff ? 0 : -1;
}

SV_EXPORT int ibv_fork_init(void) { return 0; }
SV_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }

SV_EXPORT const char *ibv_wc_status_str(enum ibv_wc_status status) {
    static const char *const names[] = {
        [IBV_WC_SUCCESS] = "success",
        [IBV_WC_LOC_LEN_ERR] = "local length error",
        [IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
        [IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
        [IBV_WC_LOC_PROT_ERR] = "local protection error",
        [IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
        [IBV_WC_MW_BIND_ERR] = "memory management operation error",
        [IBV_WC_BAD_RESP_ERR] = "bad response error",
        [IBV_WC_LOC_ACCESS_ERR] = "local access error",
        [IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
        [IBV_WC_REM_ACCESS_ERR] = "remote access error",
        [IBV_WC_REM_OP_ERR] = "remote operation error",
        [IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
        [IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
        [IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
        [IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
        [IBV_WC_REM_ABORT_ERR] = "aborted error",
        [IBV_WC_INV_EECN_ERR] = "invalid EE context number",
        [IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
        [IBV_WC_FATAL_ERR] = "fatal error",
        [IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
        [IBV_WC_GENERAL_ERR] = "general error",
    };
    if ((unsigned)status < sizeof(names) / sizeof(names[0]) && names[status]) return names[status];
    return "unknown";
}

/* ---------------------------------------------------------------- PD and MR */

SV_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx) {
    struct sv_pd *pd = calloc(1, sizeof(*pd));
    if (!pd) { errno = ENOMEM; return NULL; }
    pd->pd.context = ctx;
    pthread_mutex_init(&pd->lock, NULL);
    return &pd->pd;
}

SV_EXPORT int ibv_dealloc_pd(struct ibv_pd *p) {
    struct sv_pd *pd = to_pd(p);
    if (pd->mrs) return EBUSY; /* as the kernel refuses while MRs still use it */
    pthread_mutex_destroy(&pd->lock);
    free(pd);
    return 0;
}

static atomic_uint sv_next_key = 0x100;

static struct ibv_mr *sv_reg(struct ibv_pd *p, void *addr, size_t length, uint64_t iova, unsigned access) {
    (void)iova;
    struct sv_pd *pd = to_pd(p);
    if (((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE))
        || (!addr && length)) {
        errno = EINVAL;
        return NULL;
    }
    if (sv_memlock >= 0 && atomic_load(&sv_registered) + (long long)length > sv_memlock) {
        errno = ENOMEM; /* what pinning beyond RLIMIT_MEMLOCK gives */
        return NULL;
    }
    struct sv_mr *mr = calloc(1, sizeof(*mr));
    if (!mr) { errno = ENOMEM; return NULL; }
    atomic_fetch_add(&sv_registered, (long long)length);
    mr->mr.context = p->context;
    mr->mr.pd = p;
    mr->mr.addr = addr;
    mr->mr.length = length;
    mr->mr.lkey = mr->mr.rkey = atomic_fetch_add(&sv_next_key, 1);
    mr->access = access;
    pthread_mutex_lock(&pd->lock);
    mr->next = pd->mrs;
    pd->mrs = mr;
    pthread_mutex_unlock(&pd->lock);
    return &mr->mr;
}

SV_EXPORT struct ibv_mr *(ibv_reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access) {
    return sv_reg(pd, addr, length, (uintptr_t)addr, (unsigned)access);
}

SV_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
                                          uint64_t iova, unsigned int access) {
    return sv_reg(pd, addr, length, iova, access & ~IBV_ACCESS_OPTIONAL_RANGE);
}

SV_EXPORT int ibv_dereg_mr(struct ibv_mr *m) {
    struct sv_pd *pd = to_pd(m->pd);
    pthread_mutex_lock(&pd->lock);
    for (struct sv_mr **pp = &pd->mrs; *pp; pp = &(*pp)->next) {
        if (&(*pp)->mr == m) {
            struct sv_mr *mr = *pp;
            *pp = mr->next;
            pthread_mutex_unlock(&pd->lock);
            atomic_fetch_sub(&sv_registered, (long long)mr->mr.length);
            free(mr);
            return 0;
        }
    }
    pthread_mutex_unlock(&pd->lock);
    return EINVAL;
}

/* Is [addr, addr+length) inside an MR of this PD with this lkey (and write access if asked)? */
static int sv_sge_ok(struct sv_pd *pd, const struct ibv_sge *s, int need_write) {
    if (s->length == 0) return 1;
    int ok = 0;
    pthread_mutex_lock(&pd->lock);
    for (struct sv_mr *mr = pd->mrs; mr; mr = mr->next) {
        if (mr->mr.lkey != s->lkey) continue;
        uintptr_t lo = (uintptr_t)mr->mr.addr, hi = lo + mr->mr.length;
        ok = s->addr >= lo && s->addr + s->length <= hi && s->addr + s->length >= s->addr
             && (!need_write || (mr->access & IBV_ACCESS_LOCAL_WRITE));
        break;
    }
    pthread_mutex_unlock(&pd->lock);
    return ok;
}

/* ---------------------------------------------------------------- completion channel and CQ */

SV_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *ctx) {
    struct sv_channel *c = calloc(1, sizeof(*c));
    if (!c) { errno = ENOMEM; return NULL; }
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) { free(c); return NULL; }
    c->ch.context = ctx;
    c->ch.fd = p[0];
    c->wfd = p[1];
    pthread_mutex_init(&c->lock, NULL);
    return &c->ch;
}

SV_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *ch) {
    struct sv_channel *c = (struct sv_channel *)ch;
    if (ch->refcnt) return EBUSY;
    close(c->ch.fd);
    close(c->wfd);
    free(c->queue);
    pthread_mutex_destroy(&c->lock);
    free(c);
    return 0;
}

SV_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
                                       struct ibv_comp_channel *channel, int comp_vector) {
    if (cqe < 1 || cqe > SV_MAX_CQE || comp_vector < 0 || comp_vector >= ctx->num_comp_vectors) {
        errno = EINVAL;
        return NULL;
    }
    struct sv_cq *cq = calloc(1, sizeof(*cq));
    if (!cq || !(cq->ring = calloc((size_t)cqe, sizeof(struct ibv_wc)))) {
        free(cq);
        errno = ENOMEM;
        return NULL;
    }
    cq->cap = cqe;
    cq->cq.context = ctx;
    cq->cq.channel = channel;
    cq->cq.cq_context = cq_context;
    cq->cq.cqe = cqe;
    pthread_mutex_init(&cq->cq.mutex, NULL);
    pthread_cond_init(&cq->cq.cond, NULL);
    pthread_mutex_init(&cq->lock, NULL);
    if (channel) {
        pthread_mutex_lock(&((struct sv_channel *)channel)->lock);
        channel->refcnt++;
        pthread_mutex_unlock(&((struct sv_channel *)channel)->lock);
    }
    return &cq->cq;
}

static void sv_channel_drop(struct sv_channel *c, struct ibv_cq *cq) {
    pthread_mutex_lock(&c->lock);
    int j = 0;
    for (int i = 0; i < c->qlen; i++)
        if (c->queue[i] != cq) c->queue[j++] = c->queue[i];
    c->qlen = j;
    c->ch.refcnt--;
    pthread_mutex_unlock(&c->lock);
}

SV_EXPORT int ibv_destroy_cq(struct ibv_cq *c) {
    struct sv_cq *cq = to_cq(c);
    if (c->channel) sv_channel_drop((struct sv_channel *)c->channel, c);
    /* as libibverbs: wait until every event handed out has been acknowledged */
    pthread_mutex_lock(&c->mutex);
    while (c->comp_events_completed != cq->events_reported)
        pthread_cond_wait(&c->cond, &c->mutex);
    pthread_mutex_unlock(&c->mutex);
    pthread_mutex_destroy(&cq->lock);
    free(cq->ring);
    free(cq);
    return 0;
}

static int sv_req_notify_cq(struct ibv_cq *c, int solicited_only) {
    (void)solicited_only; /* every completion here is "solicited" enough */
    struct sv_cq *cq = to_cq(c);
    if (!c->channel) return EINVAL;
    pthread_mutex_lock(&cq->lock);
    cq->armed = 1;
    pthread_mutex_unlock(&cq->lock);
    return 0;
}

SV_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context) {
    struct sv_channel *c = (struct sv_channel *)ch;
    for (;;) {
        char b;
        ssize_t n = read(c->ch.fd, &b, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n != 1) return -1;
        pthread_mutex_lock(&c->lock);
        if (c->qlen) {
            struct ibv_cq *got = c->queue[0];
            memmove(c->queue, c->queue + 1, (size_t)(c->qlen - 1) * sizeof(*c->queue));
            c->qlen--;
            pthread_mutex_lock(&got->mutex);
            to_cq(got)->events_reported++;
            pthread_mutex_unlock(&got->mutex);
            pthread_mutex_unlock(&c->lock);
            *cq = got;
            *cq_context = got->cq_context;
            return 0;
        }
        pthread_mutex_unlock(&c->lock); /* the event of a destroyed CQ: keep waiting */
    }
}

SV_EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents) {
    pthread_mutex_lock(&cq->mutex);
    cq->comp_events_completed += nevents;
    pthread_cond_signal(&cq->cond);
    pthread_mutex_unlock(&cq->mutex);
}

static void sv_cq_push(struct sv_cq *cq, const struct ibv_wc *wc) {
    int notify = 0;
    pthread_mutex_lock(&cq->lock);
    if (cq->count == cq->cap) {
        cq->overrun = 1; /* a real CQ raises IBV_EVENT_CQ_ERR here; the entry is lost */
        fprintf(stderr, "softverbs: CQ overrun (%d entries), completion of wr_id %llu lost\n",
                cq->cap, (unsigned long long)wc->wr_id);
    } else {
        cq->ring[(cq->head + cq->count) % cq->cap] = *wc;
        cq->count++;
    }
    if (cq->armed) {
        cq->armed = 0;
        notify = 1;
    }
    pthread_mutex_unlock(&cq->lock);
    if (notify) {
        struct sv_channel *c = (struct sv_channel *)cq->cq.channel;
        pthread_mutex_lock(&c->lock);
        if (c->qlen == c->qcap) {
            int ncap = c->qcap ? c->qcap * 2 : 16;
            struct ibv_cq **q = realloc(c->queue, (size_t)ncap * sizeof(*q));
            if (q) { c->queue = q; c->qcap = ncap; }
        }
        if (c->qlen < c->qcap) {
            c->queue[c->qlen++] = &cq->cq;
            ssize_t w = write(c->wfd, "e", 1);
            (void)w;
        }
        pthread_mutex_unlock(&c->lock);
    }
}

static int sv_poll_cq(struct ibv_cq *c, int num, struct ibv_wc *wc) {
    struct sv_cq *cq = to_cq(c);
    int n = 0;
    pthread_mutex_lock(&cq->lock);
    while (n < num && cq->count) {
        wc[n++] = cq->ring[cq->head];
        cq->head = (cq->head + 1) % cq->cap;
        cq->count--;
    }
    /* A poller spinning on an empty CQ waits a little between polls. Peers spin on poll_cq
     * while a connection is busy (llama.cpp: 100 ms after each completion); on an HCA the
     * data moves meanwhile without the CPU, here this device's own threads move it, and two
     * spinning peers took both cores of a 2-core machine from them and from everything else.
     * A completion is seen at most SV_POLL_NAP later, an HCA's order of latency. */
    cq->empty_polls = n ? 0 : cq->empty_polls + 1;
    int nap = cq->empty_polls > SV_SPIN_POLLS;
    pthread_mutex_unlock(&cq->lock);
    if (nap) {
        struct timespec ts = {0, SV_POLL_NAP_NS};
        nanosleep(&ts, NULL);
    }
    return n;
}

/* ---------------------------------------------------------------- work queues */

static int sv_queue_init(struct sv_queue *q, int cap) {
    q->wr = calloc((size_t)cap, sizeof(*q->wr));
    q->cap = cap;
    return q->wr ? 0 : ENOMEM;
}
static struct sv_wr *sv_queue_head(struct sv_queue *q) { return q->count ? &q->wr[q->head] : NULL; }
static struct sv_wr *sv_queue_tail(struct sv_queue *q) { return &q->wr[(q->head + q->count) % q->cap]; }
static void sv_queue_pop(struct sv_queue *q) {
    free(q->wr[q->head].inline_data);
    q->wr[q->head].inline_data = NULL;
    q->head = (q->head + 1) % q->cap;
    q->count--;
}

static const char *sv_state_name(enum ibv_qp_state s) {
    static const char *const n[] = SV_STATE_NAMES;
    return (unsigned)s < sizeof(n) / sizeof(n[0]) ? n[s] : "?";
}

static void sv_stats_write(struct sv_qp *q) {
    if (q->stats_fd < 0) return;
    char buf[768];
    int n = snprintf(buf, sizeof(buf),
        "{\"pid\": %d, \"qpn\": %u, \"dest_qpn\": %u, \"state\": \"%s\", \"sends\": %llu, "
        "\"send_bytes\": %llu, \"inline_sends\": %llu, \"max_send\": %llu, \"recvs\": %llu, "
        "\"recv_bytes\": %llu, \"rnr_naks_sent\": %llu, \"rnr_naks_received\": %llu, "
        "\"retries\": %llu, \"errors\": %llu, \"max_send_queue\": %llu, \"max_recv_queue\": %llu}\n",
        (int)getpid(), q->qp.qp_num, q->dest_qpn, sv_state_name(q->qp.state), q->st.sends,
        q->st.send_bytes, q->st.inline_sends, q->st.max_send, q->st.recvs, q->st.recv_bytes,
        q->st.rnr_naks_sent, q->st.rnr_naks_received, q->st.retries, q->st.errors,
        q->st.max_send_queue, q->st.max_recv_queue);
    if (pwrite(q->stats_fd, buf, (size_t)n, 0) == n) {
        int rc = ftruncate(q->stats_fd, n);
        (void)rc;
    }
}

static void sv_complete(struct sv_qp *q, struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_status status,
                        enum ibv_wc_opcode opcode, uint32_t byte_len) {
    struct ibv_wc wc;
    memset(&wc, 0, sizeof(wc));
    wc.wr_id = wr_id;
    wc.status = status;
    wc.opcode = opcode;
    wc.byte_len = byte_len;
    wc.qp_num = q->qp.qp_num;
    wc.src_qp = q->dest_qpn;
    if (status != IBV_WC_SUCCESS && status != IBV_WC_WR_FLUSH_ERR) q->st.errors++;
    sv_cq_push(to_cq(cq), &wc);
}

/* Move to ERR and flush both queues, as an HCA does: every outstanding WR completes with
 * WR_FLUSH_ERR, in order (send WRs that asked for no completion still get one). Lock held. */
static void sv_to_error(struct sv_qp *q) {
    if (q->qp.state != IBV_QPS_ERR) sv_log("qp %u -> ERR", q->qp.qp_num);
    q->qp.state = IBV_QPS_ERR;
    while (q->rq.count) {
        sv_complete(q, q->qp.recv_cq, sv_queue_head(&q->rq)->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0);
        sv_queue_pop(&q->rq);
    }
    while (q->sq.count) {
        sv_complete(q, q->qp.send_cq, sv_queue_head(&q->sq)->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND, 0);
        sv_queue_pop(&q->sq);
    }
    sv_stats_write(q);
    pthread_cond_broadcast(&q->cond);
}

/* ---------------------------------------------------------------- wire */

enum { MSG_HELLO = 1, MSG_REQ, MSG_CTS, MSG_ACK, MSG_RNR_NAK, MSG_NAK_INV_REQ, MSG_NAK_REM_OP, MSG_DROP };

struct sv_msg {
    uint32_t type;
    uint32_t a; /* HELLO: source QPN; REQ: PSN; RNR_NAK: min_rnr_timer */
    uint32_t b; /* HELLO: destination QPN */
    uint32_t pad;
    uint64_t len; /* REQ: message length */
};

static void sv_sock_name(struct sockaddr_un *sa, socklen_t *len, uint32_t qpn) {
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    /* abstract namespace: nothing to clean up, gone with the process */
    int n = snprintf(sa->sun_path + 1, sizeof(sa->sun_path) - 1, SV_SOCK_PREFIX "%06x", qpn);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* Wait for fd to be ready or the QP to stop (wake_fd). 1 = ready, 0 = stopping/error. */
static int sv_wait_fd(struct sv_qp *q, int fd, short ev) {
    for (;;) {
        struct pollfd p[2] = {{fd, ev, 0}, {q->wake_fd, POLLIN, 0}};
        int r = poll(p, 2, -1);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 || (p[1].revents & POLLIN)) return 0;
        if (p[0].revents) return 1;
    }
}

static int sv_io_all(struct sv_qp *q, int fd, struct iovec *iov, int iovcnt, int writing) {
    while (iovcnt > 0) {
        if (!sv_wait_fd(q, fd, writing ? POLLOUT : POLLIN)) return -1;
        ssize_t n = writing ? sendmsg(fd, &(struct msghdr){.msg_iov = iov, .msg_iovlen = (size_t)iovcnt}, MSG_NOSIGNAL | MSG_DONTWAIT)
                            : readv(fd, iov, iovcnt);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) return -1;
        while (iovcnt > 0 && (size_t)n >= iov->iov_len) { n -= (ssize_t)iov->iov_len; iov++; iovcnt--; }
        if (iovcnt > 0) { iov->iov_base = (char *)iov->iov_base + n; iov->iov_len -= (size_t)n; }
    }
    return 0;
}

static int sv_send_msg(struct sv_qp *q, int fd, const struct sv_msg *m) {
    struct iovec v = {(void *)m, sizeof(*m)};
    return sv_io_all(q, fd, &v, 1, 1);
}

static int sv_recv_msg(struct sv_qp *q, int fd, struct sv_msg *m) {
    struct iovec v = {m, sizeof(*m)};
    return sv_io_all(q, fd, &v, 1, 0);
}

static int sv_discard(struct sv_qp *q, int fd, uint64_t n) {
    uint8_t sink[4096];
    while (n) {
        struct iovec v = {sink, n < sizeof(sink) ? (size_t)n : sizeof(sink)};
        n -= v.iov_len;
        if (sv_io_all(q, fd, &v, 1, 0) != 0) return -1;
    }
    return 0;
}

/* Sleep like an HCA's retry timer, but wake at once when the QP is being destroyed. */
static void sv_sleep_us(struct sv_qp *q, double us) {
    struct timespec ts = {(time_t)(us / 1e6), (long)((us - (double)(time_t)(us / 1e6) * 1e6) * 1e3)};
    struct pollfd p = {q->wake_fd, POLLIN, 0};
    while (ppoll(&p, 1, &ts, NULL) < 0 && errno == EINTR) {}
}

/* IB spec: local ACK timeout = 4.096 us * 2^timeout; 0 = infinite (we use 2^31 us then).
 * Unlike an HCA the peer here is a process the scheduler may not run for a while: a retry
 * waits at least SV_RETRY_FLOOR_US, so a loaded machine does not turn "not yet ready" into
 * "retry exceeded" (a dead peer is still reported, only later). */
#define SV_RETRY_FLOOR_US 500000.0
static double sv_timeout_us(uint8_t t) {
    double us = t ? 4.096 * (double)(1ULL << (t > 31 ? 31 : t)) : 2147483648.0;
    return us < SV_RETRY_FLOOR_US ? SV_RETRY_FLOOR_US : us;
}

/* IB spec table of RNR NAK timer codes, in microseconds */
static double sv_rnr_us(uint8_t code) {
    static const double t[32] = {655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960,
                                 1280, 1920, 2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720,
                                 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};
    return t[code & 31];
}

static uint32_t sv_npkts(struct sv_qp *q, uint64_t len) {
    uint64_t mtu = 128u << q->path_mtu;
    return len ? (uint32_t)((len + mtu - 1) / mtu) : 1;
}

/* A SEND's and a RECV's counters, written at once: takes the lock. */
static void sv_count_send(struct sv_qp *q, const struct sv_wr *wr) {
    pthread_mutex_lock(&q->lock);
    q->st.sends++;
    q->st.send_bytes += wr->length;
    if (wr->inline_data) q->st.inline_sends++;
    if (wr->length > q->st.max_send) q->st.max_send = wr->length;
    sv_stats_write(q);
    pthread_mutex_unlock(&q->lock);
}
static void sv_count_recv(struct sv_qp *q, uint64_t len) {
    pthread_mutex_lock(&q->lock);
    q->rq_psn = (q->rq_psn + sv_npkts(q, len)) & 0xffffff;
    q->st.recvs++;
    q->st.recv_bytes += len;
    sv_stats_write(q);
    pthread_mutex_unlock(&q->lock);
}

/* Requester: carry one SEND. Returns the completion status. Called without the lock; the
 * head WR stays in the queue (and its buffers untouched by the app) until completion. */
static enum ibv_wc_status sv_transmit(struct sv_qp *q, struct sv_wr *wr) {
    struct sv_pd *pd = to_pd(q->qp.pd);
    struct iovec iov[SV_MAX_SGE];
    int niov = 0;
    if (wr->inline_data) {
        iov[niov++] = (struct iovec){wr->inline_data, wr->length};
    } else {
        for (int i = 0; i < wr->num_sge; i++) {
            if (!sv_sge_ok(pd, &wr->sge[i], 0)) return IBV_WC_LOC_PROT_ERR;
            if (wr->sge[i].length)
                iov[niov++] = (struct iovec){(void *)(uintptr_t)wr->sge[i].addr, wr->sge[i].length};
        }
    }
    unsigned retries = 0, rnr = 0;
    for (;;) {
        pthread_mutex_lock(&q->lock);
        int stop = q->stopping || q->qp.state != IBV_QPS_RTS;
        uint32_t psn = q->sq_psn, dest = q->dest_qpn;
        int fd = q->out_fd;
        int reachable = sv_is_local_gid(q->ah.grh.dgid.raw);
        pthread_mutex_unlock(&q->lock);
        if (stop) return IBV_WC_WR_FLUSH_ERR;
        int ok = 0;
        struct sv_msg m;
        if (fd < 0 && reachable) {
            struct sockaddr_un sa;
            socklen_t sl;
            sv_sock_name(&sa, &sl, dest);
            fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sl) != 0) { close(fd); fd = -1; }
            if (fd >= 0) {
                struct sv_msg h = {MSG_HELLO, q->qp.qp_num, dest, 0, 0};
                if (sv_send_msg(q, fd, &h) != 0) { close(fd); fd = -1; }
            }
            pthread_mutex_lock(&q->lock);
            q->out_fd = fd;
            pthread_mutex_unlock(&q->lock);
        }
        if (fd >= 0) {
            struct sv_msg r = {MSG_REQ, psn, 0, 0, wr->length};
            ok = sv_send_msg(q, fd, &r) == 0 && sv_recv_msg(q, fd, &m) == 0;
        }
        if (ok && m.type == MSG_CTS) {
            /* The responder took a RECV for this SEND: counted before a byte leaves, so
             * whoever sees the data can see the count (a server killed as soon as its last
             * answer arrived kept a stale count when it was counted at the ACK). A SEND cut
             * short after this leaves both QPs in error, which is counted too. */
#ifndef SOFTVERBS_PLANT_LATE_COUNT
            sv_count_send(q, wr);
#endif
            struct iovec v[SV_MAX_SGE];
            memcpy(v, iov, sizeof(iov[0]) * (size_t)niov);
            ok = sv_io_all(q, fd, v, niov, 1) == 0 && sv_recv_msg(q, fd, &m) == 0 && m.type == MSG_ACK;
            if (ok) {
                pthread_mutex_lock(&q->lock);
                q->sq_psn = (q->sq_psn + sv_npkts(q, wr->length)) & 0xffffff;
                pthread_mutex_unlock(&q->lock);
                return IBV_WC_SUCCESS;
            }
        } else if (ok && m.type == MSG_RNR_NAK) {
            /* counted under the lock and written now: the SEND may never complete */
            pthread_mutex_lock(&q->lock);
            q->st.rnr_naks_received++;
            sv_stats_write(q);
            pthread_mutex_unlock(&q->lock);
            if (q->rnr_retry != 7 && ++rnr > q->rnr_retry) return IBV_WC_RNR_RETRY_EXC_ERR;
            sv_sleep_us(q, sv_rnr_us((uint8_t)m.a));
            continue;
        } else if (ok && m.type == MSG_NAK_INV_REQ) {
            return IBV_WC_REM_INV_REQ_ERR;
        } else if (ok && m.type == MSG_NAK_REM_OP) {
            return IBV_WC_REM_OP_ERR;
        }
        /* silence (DROP), no such QP, or the connection broke: a lost packet to an HCA */
        if (!ok && fd >= 0) {
            pthread_mutex_lock(&q->lock);
            if (q->out_fd == fd) q->out_fd = -1;
            pthread_mutex_unlock(&q->lock);
            close(fd);
        }
        if (++retries > q->retry_cnt) return IBV_WC_RETRY_EXC_ERR;
        pthread_mutex_lock(&q->lock);
        q->st.retries++;
        sv_stats_write(q);
        pthread_mutex_unlock(&q->lock);
        sv_sleep_us(q, sv_timeout_us(q->timeout));
    }
}

static void *sv_requester(void *arg) {
    struct sv_qp *q = arg;
    pthread_mutex_lock(&q->lock);
    for (;;) {
        while (!q->stopping && !(q->qp.state == IBV_QPS_RTS && q->sq.count))
            pthread_cond_wait(&q->cond, &q->lock);
        if (q->stopping) break;
        struct sv_wr *wr = sv_queue_head(&q->sq);
        pthread_mutex_unlock(&q->lock);
        enum ibv_wc_status st = sv_transmit(q, wr);
        pthread_mutex_lock(&q->lock);
        if (q->stopping) break;
        if (q->sq.count == 0 || sv_queue_head(&q->sq) != wr) continue; /* flushed meanwhile */
        if (st == IBV_WC_SUCCESS) { /* counted in sv_transmit, before the data left */
#ifdef SOFTVERBS_PLANT_LATE_COUNT
            struct sv_wr sent = *wr; /* only its length and whether it was inline count */
#endif
            if (wr->signaled || q->sq_sig_all)
                sv_complete(q, q->qp.send_cq, wr->wr_id, st, IBV_WC_SEND, wr->length);
            sv_queue_pop(&q->sq);
            sv_stats_write(q);
#ifdef SOFTVERBS_PLANT_LATE_COUNT /* planted fault for the tests: counted after the completion */
            pthread_mutex_unlock(&q->lock);
            sv_sleep_us(q, 300000);
            sv_count_send(q, &sent);
            pthread_mutex_lock(&q->lock);
#endif
        } else {
            sv_log("qp %u: SEND wr_id %llu failed: %s", q->qp.qp_num,
                   (unsigned long long)wr->wr_id, ibv_wc_status_str(st));
            sv_complete(q, q->qp.send_cq, wr->wr_id, st, IBV_WC_SEND, 0);
            sv_queue_pop(&q->sq);
            sv_to_error(q);
        }
        pthread_cond_broadcast(&q->cond);
    }
    pthread_mutex_unlock(&q->lock);
    return NULL;
}

/* Responder: answer one REQ on the incoming connection. -1 drops the connection. */
/* One capture record for a SEND that landed, written before its completion is seen, so the
 * application has not touched the RECV yet; one writev per record (O_APPEND). */
static void sv_capture(struct sv_qp *q, const struct iovec *data, int niov, uint64_t len) {
    if (q->capture_fd < 0) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t = (double)ts.tv_sec + ts.tv_nsec / 1e9;
    uint32_t n = (uint32_t)len;
    struct iovec iov[SV_MAX_SGE + 2] = {{&t, sizeof(t)}, {&n, sizeof(n)}};
    for (int i = 0; i < niov; i++) iov[i + 2] = data[i];
    ssize_t w = writev(q->capture_fd, iov, niov + 2);
    (void)w;
}

/* The head RECV (wr_id) failed with err: its completion, then the QP to error. */
static void sv_fail_head(struct sv_qp *q, uint64_t wr_id, enum ibv_wc_status err) {
    pthread_mutex_lock(&q->lock);
    /* the head RECV is still ours unless the QP failed meanwhile (and flushed it) */
    if (q->qp.state != IBV_QPS_ERR && q->rq.count && sv_queue_head(&q->rq)->wr_id == wr_id) {
        sv_complete(q, q->qp.recv_cq, wr_id, err, IBV_WC_RECV, 0);
        sv_queue_pop(&q->rq);
    }
    sv_to_error(q);
    pthread_mutex_unlock(&q->lock);
}

static int sv_respond(struct sv_qp *q, int fd, const struct sv_msg *req, uint32_t src_qpn) {
    struct sv_msg a = {MSG_DROP, 0, 0, 0, 0};
    struct iovec iov[SV_MAX_SGE];
    int niov = 0;
    uint64_t wr_id = 0;
    enum ibv_wc_status err = IBV_WC_SUCCESS; /* the head RECV's error, completed after the NAK */
    pthread_mutex_lock(&q->lock);
    enum ibv_qp_state s = q->qp.state;
    if ((s != IBV_QPS_RTR && s != IBV_QPS_RTS) || src_qpn != q->dest_qpn || req->a != q->rq_psn) {
        /* an HCA drops such packets without a word */
    } else if (!q->rq.count) {
#ifdef SOFTVERBS_PLANT_NO_RNR /* planted fault for the tests: a SEND with no RECV vanishes */
        pthread_mutex_unlock(&q->lock);
        struct sv_msg cts = {MSG_CTS, 0, 0, 0, 0}, planted_ack = {MSG_ACK, 0, 0, 0, 0};
        if (sv_send_msg(q, fd, &cts) != 0 || sv_discard(q, fd, req->len) != 0) return -1;
        return sv_send_msg(q, fd, &planted_ack);
#endif
        a.type = MSG_RNR_NAK;
        a.a = q->min_rnr_timer;
        q->st.rnr_naks_sent++;
        sv_stats_write(q);
    } else {
        struct sv_wr *wr = sv_queue_head(&q->rq);
        struct sv_pd *pd = to_pd(q->qp.pd);
        int prot_ok = 1;
        for (int i = 0; i < wr->num_sge; i++) prot_ok &= sv_sge_ok(pd, &wr->sge[i], 1);
#ifdef SOFTVERBS_PLANT_TRUNCATE /* planted fault for the tests: oversized SENDs are cut */
        if (!prot_ok || 0) {
#else
        if (!prot_ok || req->len > wr->length) {
#endif
            err = prot_ok ? IBV_WC_LOC_LEN_ERR : IBV_WC_LOC_PROT_ERR;
            sv_log("qp %u: incoming SEND of %llu bytes, head RECV wr_id %llu (%u bytes): %s",
                   q->qp.qp_num, (unsigned long long)req->len, (unsigned long long)wr->wr_id,
                   wr->length, ibv_wc_status_str(err));
            wr_id = wr->wr_id;
            a.type = prot_ok ? MSG_NAK_INV_REQ : MSG_NAK_REM_OP;
        } else {
            wr_id = wr->wr_id;
            uint64_t left = req->len;
            for (int i = 0; i < wr->num_sge && left; i++) {
                uint32_t n = wr->sge[i].length < left ? wr->sge[i].length : (uint32_t)left;
                if (n) iov[niov++] = (struct iovec){(void *)(uintptr_t)wr->sge[i].addr, n};
                left -= n;
            }
            sv_queue_pop(&q->rq); /* ours now; the data lands before the completion is seen */
            a.type = MSG_CTS;
        }
    }
    pthread_mutex_unlock(&q->lock);
    /* DROP stands for the silence of an HCA that discards the packet: the requester counts
     * it as a lost packet (retry after `timeout`), without waiting the timeout for nothing.
     * An answer goes out before the receiver's completion is visible, as an HCA's does: an
     * application that exits on its completion must not take the ACK/NAK with it. */
#ifdef SOFTVERBS_PLANT_LATE_ANSWER /* planted fault for the tests: the completion first */
    if (err != IBV_WC_SUCCESS) sv_fail_head(q, wr_id, err), sv_sleep_us(q, 300000);
    int sent = sv_send_msg(q, fd, &a);
#else
    int sent = sv_send_msg(q, fd, &a);
    if (err != IBV_WC_SUCCESS) sv_fail_head(q, wr_id, err);
#endif
    if (sent != 0) return -1;
    if (a.type != MSG_CTS) return 0;
    uint64_t landed = 0;
    struct iovec landing[SV_MAX_SGE]; /* sv_io_all consumes its iovec; the capture needs it */
    for (int i = 0; i < niov; i++) landed += iov[i].iov_len, landing[i] = iov[i];
    if ((niov && sv_io_all(q, fd, landing, niov, 0) != 0) || sv_discard(q, fd, req->len - landed) != 0) {
        pthread_mutex_lock(&q->lock); /* the requester vanished mid-message: the RECV is lost */
        sv_complete(q, q->qp.recv_cq, wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0);
        sv_to_error(q);
        pthread_mutex_unlock(&q->lock);
        return -1;
    }
    sv_capture(q, iov, niov, landed);
    /* counted before the ACK, as the requester counts before its data: a peer that exits
     * on its send completion cannot outrun this count */
#ifndef SOFTVERBS_PLANT_LATE_COUNT
    sv_count_recv(q, req->len);
#endif
    struct sv_msg ack = {MSG_ACK, 0, 0, 0, 0};
    int acked = sv_send_msg(q, fd, &ack); /* before the completion, as above */
    pthread_mutex_lock(&q->lock);
    sv_complete(q, q->qp.recv_cq, wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, (uint32_t)req->len);
    pthread_mutex_unlock(&q->lock);
#ifdef SOFTVERBS_PLANT_LATE_COUNT
    sv_sleep_us(q, 300000);
    sv_count_recv(q, req->len);
#endif
    return acked;
}

static void *sv_responder(void *arg) {
    struct sv_qp *q = arg;
    uint32_t src = 0;
    int fd = -1;
    for (;;) {
        struct pollfd p[3] = {{q->wake_fd, POLLIN, 0}, {q->listen_fd, POLLIN, 0}, {fd, POLLIN, 0}};
        int r = poll(p, fd >= 0 ? 3 : 2, -1);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 || (p[0].revents & POLLIN)) break;
        if (p[1].revents & POLLIN) {
            int nfd = accept4(q->listen_fd, NULL, NULL, SOCK_CLOEXEC);
            struct sv_msg h;
            if (nfd >= 0 && sv_recv_msg(q, nfd, &h) == 0 && h.type == MSG_HELLO) {
                if (fd >= 0) close(fd); /* the peer reconnected: the old stream is dead */
                fd = nfd;
                src = h.a;
            } else if (nfd >= 0) {
                close(nfd);
            }
            continue;
        }
        if (fd >= 0 && p[2].revents) {
            struct sv_msg m;
            if (sv_recv_msg(q, fd, &m) != 0 || m.type != MSG_REQ || sv_respond(q, fd, &m, src) != 0) {
                close(fd);
                fd = -1;
            }
        }
    }
    if (fd >= 0) close(fd);
    return NULL;
}

/* ---------------------------------------------------------------- QP */

SV_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia) {
    pthread_once(&sv_once, sv_init);
    if (ia->qp_type != IBV_QPT_RC || ia->srq) { errno = EOPNOTSUPP; return NULL; }
    struct ibv_qp_cap *c = &ia->cap;
    if (!ia->send_cq || !ia->recv_cq || c->max_send_wr > SV_MAX_WR || c->max_recv_wr > SV_MAX_WR
        || c->max_send_sge > SV_MAX_SGE || c->max_recv_sge > SV_MAX_SGE || c->max_inline_data > SV_MAX_INLINE) {
        errno = EINVAL;
        return NULL;
    }
    struct sv_qp *q = calloc(1, sizeof(*q));
    if (!q) { errno = ENOMEM; return NULL; }
    if (c->max_send_wr < 1) c->max_send_wr = 1;
    if (c->max_recv_wr < 1) c->max_recv_wr = 1;
    if (c->max_send_sge < 1) c->max_send_sge = 1;
    if (c->max_recv_sge < 1) c->max_recv_sge = 1;
    q->cap = *c;
    q->sq_sig_all = ia->sq_sig_all;
    q->listen_fd = q->in_fd = q->out_fd = q->wake_fd = q->stats_fd = q->capture_fd = -1;
    if (sv_queue_init(&q->sq, (int)c->max_send_wr) || sv_queue_init(&q->rq, (int)c->max_recv_wr)) goto fail;
    q->wake_fd = eventfd(0, EFD_CLOEXEC);
    q->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (q->wake_fd < 0 || q->listen_fd < 0) goto fail;
    uint32_t qpn = 0;
    for (int tries = 0; tries < 64; tries++) { /* the bind makes the QPN unique machine-wide */
        if (getrandom(&qpn, sizeof(qpn), 0) != sizeof(qpn)) goto fail;
        qpn &= 0xffffff;
        if (qpn < 2) continue;
        struct sockaddr_un sa;
        socklen_t sl;
        sv_sock_name(&sa, &sl, qpn);
        if (bind(q->listen_fd, (struct sockaddr *)&sa, sl) == 0) break;
        if (errno != EADDRINUSE) goto fail;
        qpn = 0;
    }
    if (!qpn || listen(q->listen_fd, 4) != 0) goto fail;
    q->qp.context = pd->context;
    q->qp.qp_context = ia->qp_context;
    q->qp.pd = pd;
    q->qp.send_cq = ia->send_cq;
    q->qp.recv_cq = ia->recv_cq;
    q->qp.qp_num = qpn;
    q->qp.state = IBV_QPS_RESET;
    q->qp.qp_type = IBV_QPT_RC;
    pthread_mutex_init(&q->qp.mutex, NULL);
    pthread_cond_init(&q->qp.cond, NULL);
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->cond, NULL);
    if (sv_stats_dir) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/qp-%d-%u.json", sv_stats_dir, (int)getpid(), qpn);
        q->stats_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        sv_stats_write(q);
    }
    if (sv_capture_dir) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/rx-%d-%u.bin", sv_capture_dir, (int)getpid(), qpn);
        q->capture_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    }
    if (pthread_create(&q->req_thread, NULL, sv_requester, q) != 0) goto fail;
    if (pthread_create(&q->resp_thread, NULL, sv_responder, q) != 0) {
        pthread_mutex_lock(&q->lock);
        q->stopping = 1;
        pthread_cond_broadcast(&q->cond);
        pthread_mutex_unlock(&q->lock);
        pthread_join(q->req_thread, NULL);
        goto fail;
    }
    sv_log("qp %u created (send_wr %u recv_wr %u inline %u)", qpn, c->max_send_wr, c->max_recv_wr,
           c->max_inline_data);
    return &q->qp;
fail:;
    int e = errno ? errno : ENOMEM;
    if (q->listen_fd >= 0) close(q->listen_fd);
    if (q->wake_fd >= 0) close(q->wake_fd);
    if (q->stats_fd >= 0) close(q->stats_fd);
    if (q->capture_fd >= 0) close(q->capture_fd);
    free(q->sq.wr);
    free(q->rq.wr);
    free(q);
    errno = e;
    return NULL;
}

SV_EXPORT int ibv_destroy_qp(struct ibv_qp *qp) {
    struct sv_qp *q = to_qp(qp);
    pthread_mutex_lock(&q->lock);
    q->stopping = 1;
    pthread_cond_broadcast(&q->cond);
    pthread_mutex_unlock(&q->lock);
    uint64_t one = 1;
    ssize_t w = write(q->wake_fd, &one, sizeof(one));
    (void)w;
    pthread_join(q->req_thread, NULL);
    pthread_join(q->resp_thread, NULL);
    sv_log("qp %u destroyed", qp->qp_num);
    close(q->listen_fd);
    if (q->out_fd >= 0) close(q->out_fd);
    close(q->wake_fd);
    if (q->stats_fd >= 0) close(q->stats_fd);
    if (q->capture_fd >= 0) close(q->capture_fd);
    while (q->sq.count) sv_queue_pop(&q->sq);
    free(q->sq.wr);
    free(q->rq.wr);
    pthread_mutex_destroy(&q->lock);
    pthread_cond_destroy(&q->cond);
    free(q);
    return 0;
}

/* Required and allowed attribute masks of the RC transitions (IB spec 11.2.4.2, the table
 * the kernel's ib_modify_qp_is_ok() enforces). */
struct sv_trans { enum ibv_qp_state from, to; int req, opt; };
static const struct sv_trans sv_rc_trans[] = {
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_INIT, IBV_QPS_RTR,
     IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
     IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
    {IBV_QPS_RTR, IBV_QPS_RTS,
     IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
     IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE},
    {IBV_QPS_RTS, IBV_QPS_RTS, 0,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE | IBV_QP_MIN_RNR_TIMER},
};

SV_EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask) {
    struct sv_qp *q = to_qp(qp);
    pthread_mutex_lock(&q->lock);
    enum ibv_qp_state cur = qp->state;
    enum ibv_qp_state to = (mask & IBV_QP_STATE) ? a->qp_state : cur;
    int rest = mask & ~IBV_QP_STATE;
    int ok = 0;
    if (to == IBV_QPS_RESET || to == IBV_QPS_ERR) {
        ok = !(rest & ~IBV_QP_CUR_STATE);
    } else {
        for (size_t i = 0; i < sizeof(sv_rc_trans) / sizeof(sv_rc_trans[0]); i++) {
            const struct sv_trans *t = &sv_rc_trans[i];
            if (t->from == cur && t->to == to)
                ok = (rest & t->req) == t->req && !(rest & ~(t->req | t->opt));
        }
    }
    if (ok && (mask & IBV_QP_PORT) && a->port_num != 1) ok = 0;
    if (ok && (mask & IBV_QP_PATH_MTU) && (a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096)) ok = 0;
    if (ok && (mask & IBV_QP_AV) && (a->ah_attr.port_num != 1 || !a->ah_attr.is_global
                                    || a->ah_attr.grh.sgid_index >= sv_ngids)) ok = 0;
    if (ok && (mask & IBV_QP_RETRY_CNT) && a->retry_cnt > 7) ok = 0;
    if (ok && (mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7) ok = 0;
    if (!ok) {
        pthread_mutex_unlock(&q->lock);
        sv_log("qp %u: modify %s -> %s with mask 0x%x refused", qp->qp_num, sv_state_name(cur),
               sv_state_name(to), mask);
        return EINVAL;
    }
    if (mask & IBV_QP_PORT) q->port_num = a->port_num;
    if (mask & IBV_QP_PKEY_INDEX) q->pkey_index = a->pkey_index;
    if (mask & IBV_QP_ACCESS_FLAGS) q->access_flags = a->qp_access_flags;
    if (mask & IBV_QP_PATH_MTU) q->path_mtu = a->path_mtu;
    if (mask & IBV_QP_DEST_QPN) q->dest_qpn = a->dest_qp_num & 0xffffff;
    if (mask & IBV_QP_RQ_PSN) q->rq_psn = a->rq_psn & 0xffffff;
    if (mask & IBV_QP_SQ_PSN) q->sq_psn = a->sq_psn & 0xffffff;
    if (mask & IBV_QP_AV) q->ah = a->ah_attr;
    if (mask & IBV_QP_MIN_RNR_TIMER) q->min_rnr_timer = a->min_rnr_timer & 31;
    if (mask & IBV_QP_TIMEOUT) q->timeout = a->timeout;
    if (mask & IBV_QP_RETRY_CNT) q->retry_cnt = a->retry_cnt;
    if (mask & IBV_QP_RNR_RETRY) q->rnr_retry = a->rnr_retry;
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC) q->max_rd_atomic = a->max_rd_atomic;
    if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) q->max_dest_rd_atomic = a->max_dest_rd_atomic;
    if (to == IBV_QPS_ERR) {
        sv_to_error(q);
    } else if (to == IBV_QPS_RESET) {
        while (q->rq.count) sv_queue_pop(&q->rq); /* RESET discards without completions */
        while (q->sq.count) sv_queue_pop(&q->sq);
        qp->state = to;
    } else {
        qp->state = to;
    }
    if (to != cur) {
        sv_log("qp %u: %s -> %s%s", qp->qp_num, sv_state_name(cur), sv_state_name(to),
               to == IBV_QPS_RTR ? " (peer qpn set)" : "");
        if (to == IBV_QPS_RTR) sv_log("qp %u: peer qpn %u rq_psn %u mtu %d", qp->qp_num,
                                      q->dest_qpn, q->rq_psn, 128 << q->path_mtu);
    }
    sv_stats_write(q);
    pthread_cond_broadcast(&q->cond);
    pthread_mutex_unlock(&q->lock);
    return 0;
}

SV_EXPORT int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, struct ibv_qp_init_attr *ia) {
    (void)mask;
    struct sv_qp *q = to_qp(qp);
    pthread_mutex_lock(&q->lock);
    memset(a, 0, sizeof(*a));
    a->qp_state = a->cur_qp_state = qp->state;
    a->path_mtu = q->path_mtu;
    a->qp_access_flags = q->access_flags;
    a->pkey_index = q->pkey_index;
    a->port_num = q->port_num;
    a->dest_qp_num = q->dest_qpn;
    a->rq_psn = q->rq_psn;
    a->sq_psn = q->sq_psn;
    a->ah_attr = q->ah;
    a->min_rnr_timer = q->min_rnr_timer;
    a->timeout = q->timeout;
    a->retry_cnt = q->retry_cnt;
    a->rnr_retry = q->rnr_retry;
    a->max_rd_atomic = q->max_rd_atomic;
    a->max_dest_rd_atomic = q->max_dest_rd_atomic;
    a->cap = q->cap;
    if (ia) {
        memset(ia, 0, sizeof(*ia));
        ia->qp_context = qp->qp_context;
        ia->send_cq = qp->send_cq;
        ia->recv_cq = qp->recv_cq;
        ia->cap = q->cap;
        ia->qp_type = qp->qp_type;
        ia->sq_sig_all = q->sq_sig_all;
    }
    pthread_mutex_unlock(&q->lock);
    return 0;
}

static int sv_fill_wr(struct sv_wr *w, uint64_t wr_id, struct ibv_sge *sg, int num_sge) {
    memset(w, 0, sizeof(*w));
    w->wr_id = wr_id;
    w->num_sge = num_sge;
    uint64_t total = 0;
    for (int i = 0; i < num_sge; i++) {
        w->sge[i] = sg[i];
        total += sg[i].length;
    }
    if (total > SV_MAX_MSG) return EINVAL;
    w->length = (uint32_t)total;
    return 0;
}

/* A new high-water mark of a queue, written at once (the next completion may never come). */
static void sv_note_depth(struct sv_qp *q, unsigned long long *mark, int count) {
    if ((unsigned long long)count <= *mark) return;
    *mark = (unsigned long long)count;
    sv_stats_write(q);
}

static int sv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
    struct sv_qp *q = to_qp(qp);
    int rc = 0;
    pthread_mutex_lock(&q->lock);
    for (; wr; wr = wr->next) {
        if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_ERR) { rc = EINVAL; break; }
        if (wr->opcode != IBV_WR_SEND) { rc = EOPNOTSUPP; break; } /* SEND only, see docs */
        if (wr->num_sge < 0 || (uint32_t)wr->num_sge > q->cap.max_send_sge) { rc = EINVAL; break; }
        if ((uint32_t)q->sq.count >= q->cap.max_send_wr) { rc = ENOMEM; break; }
        struct sv_wr *w = sv_queue_tail(&q->sq);
        if ((rc = sv_fill_wr(w, wr->wr_id, wr->sg_list, wr->num_sge))) break;
        w->signaled = !!(wr->send_flags & IBV_SEND_SIGNALED);
        if (wr->send_flags & IBV_SEND_INLINE) {
            if (w->length > q->cap.max_inline_data) { rc = EINVAL; break; }
            /* inline: the data is taken now, the buffer may be reused at once (no lkey) */
            if (!(w->inline_data = malloc(w->length ? w->length : 1))) { rc = ENOMEM; break; }
            size_t off = 0;
            for (int i = 0; i < wr->num_sge; i++) {
                memcpy(w->inline_data + off, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
                off += wr->sg_list[i].length;
            }
        }
        q->sq.count++;
        sv_note_depth(q, &q->st.max_send_queue, q->sq.count);
        if (qp->state == IBV_QPS_ERR) { /* accepted and flushed at once, as an HCA does */
            sv_complete(q, qp->send_cq, w->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND, 0);
            sv_queue_pop(&q->sq);
        }
    }
    if (rc && bad) *bad = wr;
    pthread_cond_broadcast(&q->cond);
    pthread_mutex_unlock(&q->lock);
    return rc;
}

static int sv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
    struct sv_qp *q = to_qp(qp);
    int rc = 0;
    pthread_mutex_lock(&q->lock);
    for (; wr; wr = wr->next) {
        if (qp->state == IBV_QPS_RESET) { rc = EINVAL; break; }
        if (wr->num_sge < 0 || (uint32_t)wr->num_sge > q->cap.max_recv_sge) { rc = EINVAL; break; }
        if ((uint32_t)q->rq.count >= q->cap.max_recv_wr) { rc = ENOMEM; break; }
        struct sv_wr *w = sv_queue_tail(&q->rq);
        if ((rc = sv_fill_wr(w, wr->wr_id, wr->sg_list, wr->num_sge))) break;
        q->rq.count++;
        sv_note_depth(q, &q->st.max_recv_queue, q->rq.count);
        if (qp->state == IBV_QPS_ERR) {
            sv_complete(q, qp->recv_cq, w->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0);
            sv_queue_pop(&q->rq);
        }
    }
    if (rc && bad) *bad = wr;
    pthread_mutex_unlock(&q->lock);
    return rc;
}

static struct ibv_context_ops sv_ops = {
    .poll_cq = sv_poll_cq,
    .req_notify_cq = sv_req_notify_cq,
    .post_send = sv_post_send,
    .post_recv = sv_post_recv,
};

/* ---------------------------------------------------------------- not supported here
 * Present because pyverbs and librdmacm link them (bind-now); each fails the way a device
 * without the feature does. */

#define SV_UNSUPPORTED_PTR(ret, name, ...) \
    SV_EXPORT ret name(__VA_ARGS__) { errno = EOPNOTSUPP; return NULL; }
#define SV_UNSUPPORTED_INT(name, ...) \
    SV_EXPORT int name(__VA_ARGS__) { return EOPNOTSUPP; }
#define SV_NOTHING(name, ...) \
    SV_EXPORT void name(__VA_ARGS__) {}

SV_UNSUPPORTED_PTR(struct ibv_ah *, ibv_create_ah, struct ibv_pd *pd, struct ibv_ah_attr *attr)
SV_UNSUPPORTED_PTR(struct ibv_ah *, ibv_create_ah_from_wc, struct ibv_pd *pd, struct ibv_wc *wc,
                   struct ibv_grh *grh, uint8_t port_num)
SV_UNSUPPORTED_PTR(struct ibv_srq *, ibv_create_srq, struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
SV_UNSUPPORTED_PTR(struct ibv_context *, ibv_import_device, int cmd_fd)
SV_UNSUPPORTED_PTR(struct ibv_mr *, ibv_import_mr, struct ibv_pd *pd, uint32_t mr_handle)
SV_UNSUPPORTED_PTR(struct ibv_pd *, ibv_import_pd, struct ibv_context *ctx, uint32_t pd_handle)
SV_UNSUPPORTED_PTR(struct ibv_dm *, ibv_import_dm, struct ibv_context *ctx, uint32_t dm_handle)
SV_UNSUPPORTED_PTR(struct ibv_mr *, ibv_reg_dmabuf_mr, struct ibv_pd *pd, uint64_t offset, size_t length,
                   uint64_t iova, int fd, int access)
SV_UNSUPPORTED_PTR(struct ibv_qp_ex *, ibv_qp_to_qp_ex, struct ibv_qp *qp)
SV_UNSUPPORTED_PTR(const char *, ibv_get_sysfs_path, void)
SV_UNSUPPORTED_INT(ibv_attach_mcast, struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
SV_UNSUPPORTED_INT(ibv_detach_mcast, struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
SV_UNSUPPORTED_INT(ibv_destroy_ah, struct ibv_ah *ah)
SV_UNSUPPORTED_INT(ibv_destroy_srq, struct ibv_srq *srq)
SV_UNSUPPORTED_INT(ibv_modify_srq, struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask)
SV_UNSUPPORTED_INT(ibv_query_srq, struct ibv_srq *srq, struct ibv_srq_attr *attr)
SV_UNSUPPORTED_INT(ibv_resize_cq, struct ibv_cq *cq, int cqe)
SV_UNSUPPORTED_INT(ibv_query_ece, struct ibv_qp *qp, struct ibv_ece *ece)
SV_UNSUPPORTED_INT(ibv_set_ece, struct ibv_qp *qp, struct ibv_ece *ece)
SV_UNSUPPORTED_INT(ibv_rereg_mr, struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr,
                   size_t length, int access)
SV_UNSUPPORTED_INT(ibv_read_sysfs_file, const char *dir, const char *file, char *buf, size_t size)
SV_EXPORT int ibv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *event) {
    (void)ctx; (void)event;
    errno = EOPNOTSUPP;
    return -1;
}
SV_EXPORT int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags) {
    (void)qp; (void)op; (void)flags;
    return 1; /* one stream per QP: always in order */
}
SV_NOTHING(ibv_ack_async_event, struct ibv_async_event *event)
SV_NOTHING(ibv_unimport_mr, struct ibv_mr *mr)
SV_NOTHING(ibv_unimport_pd, struct ibv_pd *pd)
SV_NOTHING(ibv_unimport_dm, struct ibv_dm *dm)
SV_NOTHING(ibv_copy_ah_attr_from_kern, struct ibv_ah_attr *dst, void *src)
SV_NOTHING(ibv_copy_path_rec_from_kern, void *dst, void *src)
SV_NOTHING(ibv_copy_path_rec_to_kern, void *dst, void *src)
SV_NOTHING(ibv_copy_qp_attr_from_kern, struct ibv_qp_attr *dst, void *src)
