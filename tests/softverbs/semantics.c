/*
 * RC semantics of the soft verbs device, through the libibverbs API only (as llama.cpp and
 * pyverbs use it). `semantics CASE` runs one case, prints "ok CASE" and exits 0, or prints
 * "FAIL CASE: why" and exits 1. Run by tests/test_softverbs.py.
 *
 * Queue pairs live in two processes (fork), the receiver in the child; the two exchange their
 * QPN/PSN/GID through a pipe, as ggml-rpc peers do through HELLO conn_caps.
 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SLOT 4096
#define NSLOTS 8
#define DEADLINE_S 20 /* no case may wait longer: a hang is a failure, not a stuck test */

static const char *case_name;
static char role[16] = "sender";

#define FAIL(...) do { fprintf(stdout, "FAIL %s (%s): ", case_name, role); \
    fprintf(stdout, __VA_ARGS__); fputc('\n', stdout); fflush(stdout); _exit(1); } while (0)
#define CHECK(cond, ...) do { if (!(cond)) FAIL(__VA_ARGS__); } while (0)

struct end {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *ch;
    struct ibv_cq *scq, *rcq;
    struct ibv_qp *qp;
    uint8_t *buf;
    struct ibv_mr *mr;
    int gid_idx;
    union ibv_gid gid;
};

struct caps { uint32_t qpn, psn; uint8_t gid[16]; };

static int find_gid_v2(struct ibv_context *ctx) {
    struct ibv_port_attr pa;
    CHECK(ibv_query_port(ctx, 1, &pa) == 0, "query_port");
    CHECK(pa.state == IBV_PORT_ACTIVE && pa.link_layer == IBV_LINK_LAYER_ETHERNET, "port attrs");
    const uint8_t want[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
    for (int i = 0; i < pa.gid_tbl_len; i++) {
        struct ibv_gid_entry e;
        if (ibv_query_gid_ex(ctx, 1, i, &e, 0) != 0) continue;
        if (!memcmp(e.gid.raw, want, 16) && e.gid_type == IBV_GID_TYPE_ROCE_V2) return i;
    }
    FAIL("no RoCE v2 GID ::ffff:127.0.0.1");
}

static void open_end(struct end *e, uint32_t max_inline, unsigned mr_access) {
    int n = 0;
    struct ibv_device **devs = ibv_get_device_list(&n);
    CHECK(devs && n == 1, "device list");
    CHECK(!strcmp(ibv_get_device_name(devs[0]), "softverbs0"), "device is %s, not the soft one",
          ibv_get_device_name(devs[0]));
    e->ctx = ibv_open_device(devs[0]);
    ibv_free_device_list(devs);
    CHECK(e->ctx, "open_device");
    e->gid_idx = find_gid_v2(e->ctx);
    CHECK(ibv_query_gid(e->ctx, 1, e->gid_idx, &e->gid) == 0, "query_gid");
    e->pd = ibv_alloc_pd(e->ctx);
    e->ch = ibv_create_comp_channel(e->ctx);
    e->scq = ibv_create_cq(e->ctx, 64, (void *)0x5c, e->ch, 0);
    e->rcq = ibv_create_cq(e->ctx, 64, (void *)0x7c, e->ch, 0);
    CHECK(e->pd && e->ch && e->scq && e->rcq, "pd/channel/cq");
    struct ibv_qp_init_attr ia = {0};
    ia.send_cq = e->scq;
    ia.recv_cq = e->rcq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 8;
    ia.cap.max_recv_wr = NSLOTS;
    ia.cap.max_send_sge = 2;
    ia.cap.max_recv_sge = 2;
    ia.cap.max_inline_data = max_inline;
    e->qp = ibv_create_qp(e->pd, &ia);
    CHECK(e->qp, "create_qp: %s", strerror(errno));
    e->buf = aligned_alloc(4096, SLOT * NSLOTS);
    e->mr = ibv_reg_mr(e->pd, e->buf, SLOT * NSLOTS, mr_access);
    CHECK(e->mr, "reg_mr");
}

static void to_init(struct end *e) {
    struct ibv_qp_attr a = {0};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
    CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0,
          "RESET->INIT");
}

static void to_rts(struct end *e, const struct caps *peer, uint8_t rnr_retry, uint8_t timeout, uint8_t retry_cnt) {
    struct ibv_qp_attr a = {0};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = peer->qpn;
    a.rq_psn = peer->psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    memcpy(&a.ah_attr.grh.dgid, peer->gid, 16);
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.grh.sgid_index = (uint8_t)e->gid_idx;
    a.ah_attr.port_num = 1;
    CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                        IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0, "INIT->RTR");
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = timeout;
    a.retry_cnt = retry_cnt;
    a.rnr_retry = rnr_retry;
    a.sq_psn = e->qp->qp_num & 0xffffff;
    a.max_rd_atomic = 1;
    CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                        IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0, "RTR->RTS");
}

static struct caps my_caps(struct end *e) {
    struct caps c = {e->qp->qp_num, e->qp->qp_num & 0xffffff, {0}};
    memcpy(c.gid, e->gid.raw, 16);
    return c;
}

static void post_recv(struct end *e, uint64_t wr_id, int slot, uint32_t len) {
    struct ibv_sge sge = {(uintptr_t)(e->buf + slot * SLOT), len, e->mr->lkey};
    struct ibv_recv_wr wr = {0}, *bad = NULL;
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    CHECK(ibv_post_recv(e->qp, &wr, &bad) == 0, "post_recv");
}

static int post_send(struct end *e, uint64_t wr_id, const void *data, uint32_t len, int inl) {
    struct ibv_sge sge = {0};
    struct ibv_send_wr wr = {0}, *bad = NULL;
    if (inl) {
        sge.addr = (uintptr_t)data;
    } else {
        memcpy(e->buf, data, len);
        sge.addr = (uintptr_t)e->buf;
        sge.lkey = e->mr->lkey;
    }
    sge.length = len;
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_SEND;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED | (inl ? IBV_SEND_INLINE : 0);
    return ibv_post_send(e->qp, &wr, &bad);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static struct ibv_wc wait_wc(struct ibv_cq *cq, const char *what) {
    struct ibv_wc wc;
    double end = now_s() + DEADLINE_S;
    for (;;) {
        int n = ibv_poll_cq(cq, 1, &wc);
        CHECK(n >= 0, "poll_cq < 0");
        if (n == 1) return wc;
        CHECK(now_s() < end, "no completion for %s within %d s", what, DEADLINE_S);
        usleep(100);
    }
}

static void expect_wc(struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_status st, int byte_len, const char *what) {
    struct ibv_wc wc = wait_wc(cq, what);
    CHECK(wc.wr_id == wr_id, "%s: wr_id %llu, expected %llu", what, (unsigned long long)wc.wr_id,
          (unsigned long long)wr_id);
    CHECK(wc.status == st, "%s: status %s, expected %s", what, ibv_wc_status_str(wc.status), ibv_wc_status_str(st));
    if (byte_len >= 0) CHECK(wc.byte_len == (uint32_t)byte_len, "%s: byte_len %u, expected %d", what, wc.byte_len, byte_len);
}

static void expect_empty(struct ibv_cq *cq, const char *what) {
    struct ibv_wc wc;
    int n = ibv_poll_cq(cq, 1, &wc);
    CHECK(n == 0, "%s: unexpected completion wr_id %llu status %s", what, (unsigned long long)wc.wr_id,
          ibv_wc_status_str(wc.status));
}

/* Wait until the device's counter `key` of QP (pid, qpn) reaches `at_least` (the stats file
 * of SOFTVERBS_STATS_DIR): how a case sees what the other side's device did. */
static void wait_counter(int pid, uint32_t qpn, const char *key, int at_least) {
    const char *dir = getenv("SOFTVERBS_STATS_DIR");
    CHECK(dir, "SOFTVERBS_STATS_DIR not set");
    char path[4096], pat[64];
    snprintf(path, sizeof(path), "%s/qp-%d-%u.json", dir, pid, qpn);
    snprintf(pat, sizeof(pat), "\"%s\": ", key);
    double end = now_s() + DEADLINE_S;
    for (;;) {
        char buf[1024] = {0};
        FILE *f = fopen(path, "r");
        CHECK(f, "no stats file %s", path);
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = 0;
        const char *k = strstr(buf, pat);
        if (k && atoi(k + strlen(pat)) >= at_least) return;
        CHECK(now_s() < end, "%s stayed below %d for %d s: %s", key, at_least, DEADLINE_S, buf);
        usleep(1000);
    }
}

/* The device's counter `key` of QP (pid, qpn) now, without waiting. */
static long long counter_now(int pid, uint32_t qpn, const char *key) {
    const char *dir = getenv("SOFTVERBS_STATS_DIR");
    CHECK(dir, "SOFTVERBS_STATS_DIR not set");
    char path[4096], pat[64], buf[1024] = {0};
    snprintf(path, sizeof(path), "%s/qp-%d-%u.json", dir, pid, qpn);
    snprintf(pat, sizeof(pat), "\"%s\": ", key);
    FILE *f = fopen(path, "r");
    CHECK(f, "no stats file %s", path);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    const char *k = strstr(buf, pat);
    CHECK(k, "no %s in %s", key, buf);
    return atoll(k + strlen(pat));
}

/* ---------------------------------------------------------------- the two processes */

static int to_child[2], to_parent[2];
static pid_t child;

static void xwrite(int fd, const void *p, size_t n) { CHECK(write(fd, p, n) == (ssize_t)n, "pipe write"); }
static void xread(int fd, void *p, size_t n) {
    struct pollfd pf = {fd, POLLIN, 0};
    CHECK(poll(&pf, 1, DEADLINE_S * 1000) == 1, "peer silent for %d s", DEADLINE_S);
    CHECK(read(fd, p, n) == (ssize_t)n, "pipe read");
}
/* a one-byte step between the processes, so cases can order events without timing */
static void signal_peer(int fd, char c) { xwrite(fd, &c, 1); }
static char await_peer(int fd) { char c; xread(fd, &c, 1); return c; }

typedef void (*case_fn)(struct end *e, const struct caps *peer, int in, int out);
struct case_def { const char *name; case_fn sender, receiver; uint8_t rnr_retry, timeout, retry_cnt; int recv_mr_access; int bogus_peer; int late_rtr; };

static int run(const struct case_def *c) {
    CHECK(pipe(to_child) == 0 && pipe(to_parent) == 0, "pipe");
    child = fork();
    CHECK(child >= 0, "fork");
    struct end e;
    int is_child = child == 0;
    if (is_child) {
        snprintf(role, sizeof(role), "receiver");
        prctl(PR_SET_PDEATHSIG, SIGKILL);
    }
    unsigned access = is_child && c->recv_mr_access ? (unsigned)c->recv_mr_access : IBV_ACCESS_LOCAL_WRITE;
    open_end(&e, 64, access);
    to_init(&e);
    struct caps mine = my_caps(&e), peer;
    int in = is_child ? to_child[0] : to_parent[0], out = is_child ? to_parent[1] : to_child[1];
    xwrite(out, &mine, sizeof(mine));
    xread(in, &peer, sizeof(peer));
    if (c->bogus_peer && !is_child) peer.qpn ^= 0x800000; /* a QPN nobody has */
    if (!(is_child && c->late_rtr)) to_rts(&e, &peer, c->rnr_retry, c->timeout, c->retry_cnt);
    signal_peer(out, 'r');
    CHECK(await_peer(in) == 'r', "peer not ready");
    (is_child ? c->receiver : c->sender)(&e, &peer, in, out);
    if (is_child) {
        signal_peer(out, 'd');
        _exit(0);
    }
    CHECK(await_peer(in) == 'd', "receiver did not finish");
    int status;
    CHECK(waitpid(child, &status, 0) == child, "waitpid");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "receiver failed (status %d)", status);
    ibv_destroy_qp(e.qp);
    ibv_dereg_mr(e.mr);
    ibv_destroy_cq(e.scq);
    ibv_destroy_cq(e.rcq);
    ibv_destroy_comp_channel(e.ch);
    ibv_dealloc_pd(e.pd);
    ibv_close_device(e.ctx);
    printf("ok %s\n", c->name);
    return 0;
}

/* ---------------------------------------------------------------- cases */

static const uint32_t SIZES[] = {10, 1, SLOT, 0, 1500};

/* each SEND fills exactly one RECV, in order, with byte_len = the SEND's length */
static void in_order_send(struct end *e, const struct caps *p, int in, int out) {
    CHECK(await_peer(in) == 'p', "receives not posted");
    uint8_t msg[SLOT];
    for (unsigned i = 0; i < sizeof(SIZES) / sizeof(SIZES[0]); i++) {
        memset(msg, 'a' + (int)i, sizeof(msg));
        CHECK(post_send(e, 100 + i, msg, SIZES[i], 0) == 0, "post_send");
        expect_wc(e->scq, 100 + i, IBV_WC_SUCCESS, (int)SIZES[i], "send completion");
    }
}
static void in_order_recv(struct end *e, const struct caps *p, int in, int out) {
    for (int i = 0; i < 6; i++) post_recv(e, (uint64_t)i, i, SLOT);
    signal_peer(out, 'p');
    for (unsigned i = 0; i < sizeof(SIZES) / sizeof(SIZES[0]); i++) {
        expect_wc(e->rcq, i, IBV_WC_SUCCESS, (int)SIZES[i], "recv completion");
        for (uint32_t k = 0; k < SIZES[i]; k++)
            CHECK(e->buf[i * SLOT + k] == 'a' + (int)i, "message %u byte %u wrong", i, k);
    }
    expect_empty(e->rcq, "after the last message"); /* RECV 5 stays posted: nothing was merged */
}

/* a SEND larger than the head RECV: LOC_LEN_ERR there, REM_INV_REQ_ERR at the sender, both
 * QPs in error, the remaining RECVs flushed */
static void len_err_send(struct end *e, const struct caps *p, int in, int out) {
    CHECK(await_peer(in) == 'p', "receives not posted");
    uint8_t msg[64] = {0};
    CHECK(post_send(e, 7, msg, 17, 0) == 0, "post_send");
    expect_wc(e->scq, 7, IBV_WC_REM_INV_REQ_ERR, -1, "oversized send");
    CHECK(post_send(e, 8, msg, 1, 0) == 0, "post_send in ERR is accepted");
    expect_wc(e->scq, 8, IBV_WC_WR_FLUSH_ERR, -1, "send after the error");
}
static void len_err_recv(struct end *e, const struct caps *p, int in, int out) {
    post_recv(e, 1, 0, 16);
    post_recv(e, 2, 1, SLOT);
    signal_peer(out, 'p');
    expect_wc(e->rcq, 1, IBV_WC_LOC_LEN_ERR, -1, "16-byte RECV for 17 bytes");
    expect_wc(e->rcq, 2, IBV_WC_WR_FLUSH_ERR, -1, "next RECV flushed");
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    CHECK(ibv_query_qp(e->qp, &a, IBV_QP_STATE, &ia) == 0 && a.qp_state == IBV_QPS_ERR, "QP not in ERR");
}

/* no RECV posted: the sender waits (RNR, retried forever with rnr_retry 7) and completes
 * only once a RECV is posted. The receiver posts only after the sender's SEND has been
 * NAKed at least once, seen through the sender's own CQ staying empty meanwhile. */
static void rnr_wait_send(struct end *e, const struct caps *p, int in, int out) {
    uint8_t msg[32];
    memset(msg, 'r', sizeof(msg));
    CHECK(post_send(e, 9, msg, sizeof(msg), 0) == 0, "post_send");
    signal_peer(out, 's');
    for (;;) { /* until the receiver has NAKed: our SEND must stay incomplete */
        expect_empty(e->scq, "send completed while no RECV was posted");
        struct pollfd pf = {in, POLLIN, 0};
        if (poll(&pf, 1, 1) == 1) break;
    }
    CHECK(await_peer(in) == 'n', "receiver never saw the RNR");
    expect_empty(e->scq, "send completed while no RECV was posted");
    signal_peer(out, 'e');
    CHECK(await_peer(in) == 'p', "receive not posted");
    expect_wc(e->scq, 9, IBV_WC_SUCCESS, 32, "send after the RECV was posted");
}
static void rnr_wait_recv(struct end *e, const struct caps *p, int in, int out) {
    CHECK(await_peer(in) == 's', "send not posted");
    /* the sender's device keeps asking; the stats file shows our device NAKing it */
    wait_counter(getpid(), e->qp->qp_num, "rnr_naks_sent", 2);
    expect_empty(e->rcq, "a RECV completed with none posted");
    signal_peer(out, 'n');
    CHECK(await_peer(in) == 'e', "sender did not check");
    post_recv(e, 3, 0, SLOT);
    signal_peer(out, 'p');
    expect_wc(e->rcq, 3, IBV_WC_SUCCESS, 32, "the waiting SEND lands");
}

/* rnr_retry < 7: the sender gives up with RNR_RETRY_EXC_ERR; nothing lands */
static void rnr_exc_send(struct end *e, const struct caps *p, int in, int out) {
    uint8_t msg[8] = {0};
    CHECK(post_send(e, 11, msg, sizeof(msg), 0) == 0, "post_send");
    expect_wc(e->scq, 11, IBV_WC_RNR_RETRY_EXC_ERR, -1, "send with rnr_retry 2 and no RECV");
    signal_peer(out, 'x');
}
static void rnr_exc_recv(struct end *e, const struct caps *p, int in, int out) {
    CHECK(await_peer(in) == 'x', "sender did not finish");
    expect_empty(e->rcq, "nothing was posted, nothing may complete");
}

/* a QPN nobody owns: transport retries exhausted (RETRY_EXC_ERR) */
static void no_peer_send(struct end *e, const struct caps *p, int in, int out) {
    uint8_t msg[8] = {0};
    CHECK(post_send(e, 12, msg, sizeof(msg), 0) == 0, "post_send");
    expect_wc(e->scq, 12, IBV_WC_RETRY_EXC_ERR, -1, "send to a missing QP");
}
static void idle_recv(struct end *e, const struct caps *p, int in, int out) {}

/* inline: the data is taken at post time, the buffer may change right after */
static void inline_send(struct end *e, const struct caps *p, int in, int out) {
    CHECK(await_peer(in) == 'p', "receive not posted");
    char msg[48];
    memset(msg, 'i', sizeof(msg));
    CHECK(post_send(e, 13, msg, sizeof(msg), 1) == 0, "inline post_send");
    memset(msg, 'X', sizeof(msg));
    expect_wc(e->scq, 13, IBV_WC_SUCCESS, 48, "inline send");
    char big[65] = {0};
    CHECK(post_send(e, 14, big, sizeof(big), 1) == EINVAL, "inline beyond max_inline_data accepted");
}
static void inline_recv(struct end *e, const struct caps *p, int in, int out) {
    post_recv(e, 4, 0, SLOT);
    signal_peer(out, 'p');
    expect_wc(e->rcq, 4, IBV_WC_SUCCESS, 48, "inline recv");
    for (int k = 0; k < 48; k++) CHECK(e->buf[k] == 'i', "inline data changed after post");
}

/* a RECV into memory registered without LOCAL_WRITE: LOC_PROT_ERR / REM_OP_ERR */
static void prot_send(struct end *e, const struct caps *p, int in, int out) {
    CHECK(await_peer(in) == 'p', "receive not posted");
    uint8_t msg[8] = {0};
    CHECK(post_send(e, 15, msg, sizeof(msg), 0) == 0, "post_send");
    expect_wc(e->scq, 15, IBV_WC_REM_OP_ERR, -1, "send into a read-only RECV");
}
static void prot_recv(struct end *e, const struct caps *p, int in, int out) {
    post_recv(e, 5, 0, SLOT);
    signal_peer(out, 'p');
    expect_wc(e->rcq, 5, IBV_WC_LOC_PROT_ERR, -1, "read-only RECV");
}

/* the completion channel: an armed CQ raises one event for the next completion */
static void channel_send(struct end *e, const struct caps *p, int in, int out) {
    CHECK(await_peer(in) == 'p', "receive not posted");
    uint8_t msg[8] = {0};
    CHECK(ibv_req_notify_cq(e->scq, 0) == 0, "req_notify_cq");
    CHECK(post_send(e, 16, msg, sizeof(msg), 0) == 0, "post_send");
    struct pollfd pf = {e->ch->fd, POLLIN, 0};
    CHECK(poll(&pf, 1, DEADLINE_S * 1000) == 1, "no event on the channel fd");
    struct ibv_cq *cq;
    void *ctx;
    CHECK(ibv_get_cq_event(e->ch, &cq, &ctx) == 0, "get_cq_event");
    CHECK(cq == e->scq && ctx == (void *)0x5c, "event names the wrong CQ");
    ibv_ack_cq_events(cq, 1);
    expect_wc(e->scq, 16, IBV_WC_SUCCESS, 8, "send after the event");
    CHECK(post_send(e, 17, msg, sizeof(msg), 0) == 0, "post_send");
    expect_wc(e->scq, 17, IBV_WC_SUCCESS, 8, "second send");
    pf.revents = 0;
    CHECK(poll(&pf, 1, 0) == 0, "an event without arming");
}
static void channel_recv(struct end *e, const struct caps *p, int in, int out) {
    post_recv(e, 6, 0, SLOT);
    post_recv(e, 7, 1, SLOT);
    signal_peer(out, 'p');
    expect_wc(e->rcq, 6, IBV_WC_SUCCESS, 8, "first");
    expect_wc(e->rcq, 7, IBV_WC_SUCCESS, 8, "second");
}

/* verbs misuse is refused as a real device refuses it */
static void misuse_send(struct end *e, const struct caps *p, int in, int out) {
    struct ibv_qp_attr a = {0};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 1;
    CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == EINVAL, "RTS->RTS with SQ_PSN accepted");
    a.qp_state = IBV_QPS_RTR;
    CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE) == EINVAL, "RTS->RTR accepted");
    struct ibv_qp_init_attr ia = {0};
    ia.send_cq = ia.recv_cq = e->scq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 1;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    struct ibv_qp *q2 = ibv_create_qp(e->pd, &ia);
    CHECK(q2, "second QP");
    uint8_t msg[4] = {0};
    struct ibv_sge sge = {(uintptr_t)msg, 4, 0};
    struct ibv_send_wr wr = {0}, *bad = NULL;
    wr.opcode = IBV_WR_SEND;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    CHECK(ibv_post_send(q2, &wr, &bad) == EINVAL && bad == &wr, "post_send in RESET accepted");
    struct ibv_recv_wr rwr = {0}, *rbad = NULL;
    CHECK(ibv_post_recv(q2, &rwr, &rbad) == EINVAL, "post_recv in RESET accepted");
    struct ibv_qp_attr init = {0};
    init.qp_state = IBV_QPS_INIT;
    init.port_num = 1;
    CHECK(ibv_modify_qp(q2, &init, IBV_QP_STATE | IBV_QP_PORT) == EINVAL, "INIT without ACCESS_FLAGS accepted");
    ibv_destroy_qp(q2);
    /* a bad lkey in a SEND: LOC_PROT_ERR at the sender, before anything reaches the wire */
    sge.lkey = 0xdead;
    CHECK(ibv_post_send(e->qp, &wr, &bad) == 0, "post_send");
    expect_wc(e->scq, 0, IBV_WC_LOC_PROT_ERR, -1, "send with a bad lkey");
}

/* moving to ERR flushes every posted RECV, in order */
static void flush_recv(struct end *e, const struct caps *p, int in, int out) {
    post_recv(e, 21, 0, SLOT);
    post_recv(e, 22, 1, SLOT);
    struct ibv_qp_attr a = {0};
    a.qp_state = IBV_QPS_ERR;
    CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE) == 0, "->ERR");
    expect_wc(e->rcq, 21, IBV_WC_WR_FLUSH_ERR, -1, "first flushed");
    expect_wc(e->rcq, 22, IBV_WC_WR_FLUSH_ERR, -1, "second flushed");
}
static void idle_send(struct end *e, const struct caps *p, int in, int out) {}

/* a SEND that reaches a QP still in INIT is dropped (no answer from an HCA) and retried
 * after `timeout`; once the responder is RTR the retry lands */
static void late_rtr_send(struct end *e, const struct caps *p, int in, int out) {
    uint8_t msg[24];
    memset(msg, 'l', sizeof(msg));
    CHECK(post_send(e, 31, msg, sizeof(msg), 0) == 0, "post_send");
    expect_wc(e->scq, 31, IBV_WC_SUCCESS, 24, "send retried until the peer was RTR");
}
static void late_rtr_recv(struct end *e, const struct caps *p, int in, int out) {
    post_recv(e, 32, 0, SLOT);
    /* stay in INIT until the sender's device has counted a retry */
    wait_counter(getppid(), p->qpn, "retries", 1);
    expect_empty(e->rcq, "a RECV completed in INIT");
    struct caps sender = *p;
    to_rts(e, &sender, 7, 14, 7);
    expect_wc(e->rcq, 32, IBV_WC_SUCCESS, 24, "the retried SEND lands");
    CHECK(e->buf[0] == 'l' && e->buf[23] == 'l', "data");
}

/* the counters of both sides are written before either application sees its completion:
 * a test that stops a peer as soon as the last message arrived reads every byte counted */
#define COUNTED_LEN 1500
static void counted_send(struct end *e, const struct caps *p, int in, int out) {
    CHECK(await_peer(in) == 'p', "receives not posted");
    uint8_t msg[COUNTED_LEN];
    memset(msg, 'c', sizeof(msg));
    CHECK(post_send(e, 40, msg, COUNTED_LEN, 0) == 0, "post_send");
    expect_wc(e->scq, 40, IBV_WC_SUCCESS, COUNTED_LEN, "send completion");
    long long got = counter_now(child, p->qpn, "recv_bytes");
    CHECK(got == COUNTED_LEN, "send completed, receiver's recv_bytes %lld, expected %d", got, COUNTED_LEN);
}
static void counted_recv(struct end *e, const struct caps *p, int in, int out) {
    post_recv(e, 41, 0, SLOT);
    signal_peer(out, 'p');
    expect_wc(e->rcq, 41, IBV_WC_SUCCESS, COUNTED_LEN, "recv completion");
    long long sent = counter_now(getppid(), p->qpn, "send_bytes");
    CHECK(sent == COUNTED_LEN, "message arrived, sender's send_bytes %lld, expected %d", sent, COUNTED_LEN);
}

static const struct case_def CASES[] = {
    {"in_order", in_order_send, in_order_recv, 7, 14, 7, 0, 0},
    {"length_error", len_err_send, len_err_recv, 7, 14, 7, 0, 0},
    {"rnr_wait", rnr_wait_send, rnr_wait_recv, 7, 14, 7, 0, 0},
    {"rnr_retry_exceeded", rnr_exc_send, rnr_exc_recv, 2, 14, 7, 0, 0},
    {"no_such_qp", no_peer_send, idle_recv, 7, 8, 2, 0, 1},
    {"inline", inline_send, inline_recv, 7, 14, 7, 0, 0},
    {"protection_error", prot_send, prot_recv, 7, 14, 7, IBV_ACCESS_REMOTE_READ, 0},
    {"completion_channel", channel_send, channel_recv, 7, 14, 7, 0, 0},
    {"misuse", misuse_send, idle_recv, 7, 14, 7, 0, 0},
    {"flush", idle_send, flush_recv, 7, 14, 7, 0, 0},
    /* timeout 19 (2.1 s a retry, 15 s in all): room for a loaded machine to reach RTR */
    {"not_ready_retried", late_rtr_send, late_rtr_recv, 7, 19, 7, 0, 0, 1},
    {"counted_before_seen", counted_send, counted_recv, 7, 14, 7, 0, 0},
};

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    alarm(DEADLINE_S * 3); /* the whole case, both processes: a hang dies loudly */
    if (argc == 2 && !strcmp(argv[1], "--list")) {
        for (size_t i = 0; i < sizeof(CASES) / sizeof(CASES[0]); i++) printf("%s\n", CASES[i].name);
        return 0;
    }
    if (argc != 2) { fprintf(stderr, "usage: %s CASE | --list\n", argv[0]); return 2; }
    for (size_t i = 0; i < sizeof(CASES) / sizeof(CASES[0]); i++) {
        if (!strcmp(argv[1], CASES[i].name)) {
            case_name = CASES[i].name;
            return run(&CASES[i]);
        }
    }
    fprintf(stderr, "unknown case %s\n", argv[1]);
    return 2;
}
