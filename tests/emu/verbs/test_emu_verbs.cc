// Tests of the emulated verbs device (libweft_emu_verbs.so). The library is
// loaded with dlopen and its functions resolved with dlsym by name, as weft
// does (src/core/ibvwrap.h); the data path goes through the inline functions of
// <infiniband/verbs.h> (ctx->ops). Two-process cases use fork() and pipes.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef WEFT_EMU_VERBS_TEST_CUDA
// The emulated CUDA runtime (linked in): device memory for dma-buf MRs. Only
// forked children call it (it refuses to work in the child of a process that
// used it), so the parent process never does.
#include <cuda.h>
#include <cuda_runtime_api.h>
#endif

#include <chrono>
#include <thread>
#include <string>
#include <vector>

#include "../../child_env.h"

namespace {

struct Api {
    void *h = nullptr;
    ibv_device **(*get_device_list)(int *);
    void (*free_device_list)(ibv_device **);
    const char *(*get_device_name)(ibv_device *);
    ibv_context *(*open_device)(ibv_device *);
    int (*close_device)(ibv_context *);
    int (*query_device)(ibv_context *, ibv_device_attr *);
    int (*query_port)(ibv_context *, uint8_t, ibv_port_attr *);
    int (*query_gid)(ibv_context *, uint8_t, int, ibv_gid *);
    int (*query_gid_ex)(ibv_context *, uint32_t, uint32_t, ibv_gid_entry *, uint32_t, size_t);
    ibv_pd *(*alloc_pd)(ibv_context *);
    int (*dealloc_pd)(ibv_pd *);
    ibv_mr *(*reg_mr)(ibv_pd *, void *, size_t, int);
    ibv_mr *(*reg_dmabuf_mr)(ibv_pd *, uint64_t, size_t, uint64_t, int, int);
    int (*dereg_mr)(ibv_mr *);
    ibv_cq *(*create_cq)(ibv_context *, int, void *, ibv_comp_channel *, int);
    int (*destroy_cq)(ibv_cq *);
    ibv_qp *(*create_qp)(ibv_pd *, ibv_qp_init_attr *);
    int (*modify_qp)(ibv_qp *, ibv_qp_attr *, int);
    int (*destroy_qp)(ibv_qp *);
    const char *(*wc_status_str)(ibv_wc_status);
};

template <class T> void sym(void *h, T &fn, const char *name)
{
    fn = reinterpret_cast<T>(dlsym(h, name));
    if (!fn) {
        fprintf(stderr, "missing symbol %s\n", name);
        abort();
    }
}

Api &api()
{
    static Api a;
    if (!a.h) {
        a.h = dlopen(WEFT_EMU_VERBS_PATH, RTLD_NOW | RTLD_LOCAL);
        if (!a.h) {
            fprintf(stderr, "dlopen %s: %s\n", WEFT_EMU_VERBS_PATH, dlerror());
            abort();
        }
        sym(a.h, a.get_device_list, "ibv_get_device_list");
        sym(a.h, a.free_device_list, "ibv_free_device_list");
        sym(a.h, a.get_device_name, "ibv_get_device_name");
        sym(a.h, a.open_device, "ibv_open_device");
        sym(a.h, a.close_device, "ibv_close_device");
        sym(a.h, a.query_device, "ibv_query_device");
        sym(a.h, a.query_port, "ibv_query_port");
        sym(a.h, a.query_gid, "ibv_query_gid");
        sym(a.h, a.query_gid_ex, "_ibv_query_gid_ex");
        sym(a.h, a.alloc_pd, "ibv_alloc_pd");
        sym(a.h, a.dealloc_pd, "ibv_dealloc_pd");
        sym(a.h, a.reg_mr, "ibv_reg_mr");
        sym(a.h, a.reg_dmabuf_mr, "ibv_reg_dmabuf_mr");
        sym(a.h, a.dereg_mr, "ibv_dereg_mr");
        sym(a.h, a.create_cq, "ibv_create_cq");
        sym(a.h, a.destroy_cq, "ibv_destroy_cq");
        sym(a.h, a.create_qp, "ibv_create_qp");
        sym(a.h, a.modify_qp, "ibv_modify_qp");
        sym(a.h, a.destroy_qp, "ibv_destroy_qp");
        sym(a.h, a.wc_status_str, "ibv_wc_status_str");
    }
    return a;
}

const char *const kKnobs[] = {
    "WEFT_EMU_VERBS_DEVICES",   "WEFT_EMU_VERBS_PORT_DOWN", "WEFT_EMU_VERBS_LINK",
    "WEFT_EMU_VERBS_MAX_MSG",   "WEFT_EMU_VERBS_MAX_QP_WR", "WEFT_EMU_VERBS_MAX_INLINE",
    "WEFT_EMU_VERBS_MAX_CQE",   "WEFT_EMU_VERBS_MTU",       "WEFT_EMU_VERBS_FAULT_RANK",
    "WEFT_EMU_VERBS_FAIL_WR",   "WEFT_EMU_VERBS_FAIL_STATUS", "WEFT_EMU_VERBS_DROP_AFTER",
    "WEFT_EMU_VERBS_STATS",     "OMPI_COMM_WORLD_RANK",     "PMIX_RANK",
    "WEFT_EMU_VERBS_PEERMEM",   "WEFT_EMU_CUDA_GDR",
};

// The knobs a test runs with: exactly these set, every other one of kKnobs
// absent. The emulator reads them from the environment (load_config, while
// no context is open) and no test writes its environment (issue 27), so a
// test whose knobs this process's environment does not have already runs
// again, alone, in a child process started with them (tests/child_env.h);
// true then, and the test returns (WITH_KNOBS), its result the child's.
bool knobs_elsewhere(std::initializer_list<std::pair<const char *, const char *>> kv)
{
    bool same = true;
    for (auto k : kKnobs) {
        const char *want = nullptr;
        for (auto &p : kv)
            if (!strcmp(p.first, k))
                want = p.second;
        const char *have = getenv(k);
        if ((want == nullptr) != (have == nullptr) || (want && strcmp(want, have) != 0))
            same = false;
    }
    if (same)
        return false;
    weft_childenv::Vars set;
    for (auto &p : kv)
        set.push_back({p.first, p.second});
    std::vector<std::string> drop = weft_childenv::gtest_run_variables();
    for (auto k : kKnobs)
        drop.push_back(k);
    std::string why;
    int rc = weft_childenv::rerun_this_test(weft_childenv::environment_with(set, drop), &why);
    EXPECT_EQ(rc, 0) << "the test, run with its knobs in a child process, failed there (its output is above) " << why;
    return true;
}
#define WITH_KNOBS(...)                   \
    do {                                  \
        if (knobs_elsewhere(__VA_ARGS__)) \
            return;                       \
    } while (0)

std::string seg_path(pid_t pid) { return "/dev/shm/wemu-verbs-" + std::to_string(pid); }
bool seg_exists(pid_t pid)
{
    struct stat st;
    return stat(seg_path(pid).c_str(), &st) == 0;
}

double now_s()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Addr {
    uint16_t lid;
    uint32_t qpn;
    uint32_t psn;
    uint8_t gid[16];
    uint64_t addr;
    uint32_t rkey;
};

struct ConnOpts {
    uint8_t timeout = 14, retry_cnt = 7, rnr_retry = 7, min_rnr_timer = 1;
    int sgid_index = -1; // RoCE: GID index (needs is_global)
    ibv_mtu mtu = IBV_MTU_1024;
    uint8_t rd_atomic = 4;
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
};

int to_init(ibv_qp *qp, int access)
{
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = (unsigned)access;
    return api().modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

int to_rtr(ibv_qp *qp, const Addr &r, const ConnOpts &o)
{
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = o.mtu;
    a.dest_qp_num = r.qpn;
    a.rq_psn = r.psn;
    a.max_dest_rd_atomic = o.rd_atomic;
    a.min_rnr_timer = o.min_rnr_timer;
    a.ah_attr.dlid = r.lid;
    a.ah_attr.port_num = 1;
    if (o.sgid_index >= 0) {
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.sgid_index = (uint8_t)o.sgid_index;
        a.ah_attr.grh.hop_limit = 1;
        memcpy(a.ah_attr.grh.dgid.raw, r.gid, 16);
    }
    return api().modify_qp(qp, &a,
                           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

int to_rts(ibv_qp *qp, uint32_t sq_psn, const ConnOpts &o)
{
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = o.timeout;
    a.retry_cnt = o.retry_cnt;
    a.rnr_retry = o.rnr_retry;
    a.sq_psn = sq_psn;
    a.max_rd_atomic = o.rd_atomic;
    return api().modify_qp(qp, &a,
                           IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                               IBV_QP_MAX_QP_RD_ATOMIC);
}

Addr local_addr(ibv_context *ctx, ibv_qp *qp, uint32_t psn, int sgid_index, void *buf, ibv_mr *mr)
{
    Addr a{};
    ibv_port_attr pa{};
    api().query_port(ctx, 1, &pa);
    a.lid = pa.lid;
    a.qpn = qp->qp_num;
    a.psn = psn;
    if (sgid_index >= 0) {
        ibv_gid g{};
        api().query_gid(ctx, 1, sgid_index, &g);
        memcpy(a.gid, g.raw, 16);
    }
    a.addr = (uintptr_t)buf;
    a.rkey = mr ? mr->rkey : 0;
    return a;
}

// Polls until n completions arrived or timeout; returns how many (or -1).
int poll_n(ibv_cq *cq, ibv_wc *wc, int n, double timeout_s = 5.0)
{
    int got = 0;
    double end = now_s() + timeout_s;
    while (got < n && now_s() < end) {
        int r = ibv_poll_cq(cq, n - got, wc + got);
        if (r < 0)
            return -1;
        got += r;
    }
    return got;
}

ibv_context *open_dev(int index = 0)
{
    int n = 0;
    ibv_device **l = api().get_device_list(&n);
    if (!l)
        return nullptr;
    ibv_context *c = index < n ? api().open_device(l[index]) : nullptr;
    api().free_device_list(l);
    return c;
}

ibv_qp *make_qp(ibv_pd *pd, ibv_cq *scq, ibv_cq *rcq, uint32_t swr = 64, uint32_t rwr = 64, uint32_t inl = 0,
                int sig_all = 0, uint32_t sge = 4)
{
    ibv_qp_init_attr ia{};
    ia.send_cq = scq;
    ia.recv_cq = rcq;
    ia.qp_type = IBV_QPT_RC;
    ia.sq_sig_all = sig_all;
    ia.cap.max_send_wr = swr;
    ia.cap.max_recv_wr = rwr;
    ia.cap.max_send_sge = sge;
    ia.cap.max_recv_sge = sge;
    ia.cap.max_inline_data = inl;
    return api().create_qp(pd, &ia);
}

int post_write(ibv_qp *qp, uint64_t wr_id, void *src, uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey,
               unsigned flags = IBV_SEND_SIGNALED, ibv_wr_opcode op = IBV_WR_RDMA_WRITE, uint32_t imm = 0)
{
    ibv_sge s{(uintptr_t)src, len, lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = wr_id;
    wr.sg_list = &s;
    wr.num_sge = len ? 1 : 0;
    wr.opcode = op;
    wr.send_flags = flags;
    wr.imm_data = imm;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    return ibv_post_send(qp, &wr, &bad);
}

int post_send(ibv_qp *qp, uint64_t wr_id, void *src, uint32_t len, uint32_t lkey,
              unsigned flags = IBV_SEND_SIGNALED, ibv_wr_opcode op = IBV_WR_SEND, uint32_t imm = 0)
{
    return post_write(qp, wr_id, src, len, lkey, 0, 0, flags, op, imm);
}

int post_recv(ibv_qp *qp, uint64_t wr_id, void *buf, uint32_t len, uint32_t lkey)
{
    ibv_sge s{(uintptr_t)buf, len, lkey};
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = wr_id;
    wr.sg_list = &s;
    wr.num_sge = len ? 1 : 0;
    return ibv_post_recv(qp, &wr, &bad);
}

// Two QPs of one process connected to each other (loopback through the
// emulated fabric): a is the requester in most tests, b the responder.
struct Pair {
    static constexpr size_t kBuf = 1 << 20;
    ibv_context *ctx = nullptr;
    ibv_pd *pd = nullptr;
    ibv_cq *cqa = nullptr, *cqb = nullptr, *rcqa = nullptr, *rcqb = nullptr;
    ibv_qp *a = nullptr, *b = nullptr;
    std::vector<uint8_t> bufa, bufb;
    ibv_mr *mra = nullptr, *mrb = nullptr;
    Addr aa{}, ab{};

    explicit Pair(uint32_t swr = 64, uint32_t inl = 0, int cqe = 256, int mrb_access = -1, int sig_all = 0)
        : bufa(kBuf), bufb(kBuf)
    {
        ctx = open_dev();
        if (!ctx)
            return;
        pd = api().alloc_pd(ctx);
        cqa = api().create_cq(ctx, cqe, nullptr, nullptr, 0);
        cqb = api().create_cq(ctx, 256, nullptr, nullptr, 0);
        rcqa = api().create_cq(ctx, 256, nullptr, nullptr, 0);
        rcqb = api().create_cq(ctx, 256, nullptr, nullptr, 0);
        uint32_t depth = swr < 64 ? swr : 64; // within WEFT_EMU_VERBS_MAX_QP_WR
        a = make_qp(pd, cqa, rcqa, swr, depth, inl, sig_all);
        b = make_qp(pd, cqb, rcqb, depth, depth, 0, 0);
        int full = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        mra = api().reg_mr(pd, bufa.data(), kBuf, full);
        mrb = api().reg_mr(pd, bufb.data(), kBuf, mrb_access < 0 ? full : mrb_access);
    }
    bool ok() const { return ctx && pd && cqa && cqb && rcqa && rcqb && a && b && mra && mrb; }
    // full bring-up; opts_a for a (requester side params), opts_b for b
    bool connect(const ConnOpts &oa = ConnOpts(), const ConnOpts &ob = ConnOpts(), uint32_t psn_a = 100,
                 uint32_t psn_b = 200)
    {
        aa = local_addr(ctx, a, psn_a, oa.sgid_index, bufa.data(), mra);
        ab = local_addr(ctx, b, psn_b, ob.sgid_index, bufb.data(), mrb);
        return to_init(a, oa.access) == 0 && to_init(b, ob.access) == 0 && to_rtr(a, ab, oa) == 0 &&
               to_rtr(b, aa, ob) == 0 && to_rts(a, psn_a, oa) == 0 && to_rts(b, psn_b, ob) == 0;
    }
    ~Pair()
    {
        if (a) {
            EXPECT_EQ(api().destroy_qp(a), 0);
        }
        if (b) {
            EXPECT_EQ(api().destroy_qp(b), 0);
        }
        if (mra) {
            EXPECT_EQ(api().dereg_mr(mra), 0);
        }
        if (mrb) {
            EXPECT_EQ(api().dereg_mr(mrb), 0);
        }
        for (ibv_cq *c : {cqa, cqb, rcqa, rcqb}) {
            if (c) {
                EXPECT_EQ(api().destroy_cq(c), 0);
            }
        }
        if (pd) {
            EXPECT_EQ(api().dealloc_pd(pd), 0);
        }
        if (ctx) {
            EXPECT_EQ(api().close_device(ctx), 0);
        }
        EXPECT_FALSE(seg_exists(getpid())) << "segment left in /dev/shm";
    }
};

// ---- pipes and fork ----------------------------------------------------------
bool write_all(int fd, const void *p, size_t n)
{
    const char *c = static_cast<const char *>(p);
    while (n) {
        ssize_t r = write(fd, c, n);
        if (r <= 0)
            return false;
        c += r;
        n -= (size_t)r;
    }
    return true;
}
bool read_all(int fd, void *p, size_t n)
{
    char *c = static_cast<char *>(p);
    while (n) {
        ssize_t r = read(fd, c, n);
        if (r <= 0)
            return false;
        c += r;
        n -= (size_t)r;
    }
    return true;
}

#define CCHECK(c)                                                                      \
    do {                                                                               \
        if (!(c)) {                                                                    \
            fprintf(stderr, "child check failed at line %d: %s\n", __LINE__, #c);     \
            return 1;                                                                  \
        }                                                                              \
    } while (0)

struct Child {
    pid_t pid = -1;
    int rfd = -1, wfd = -1; // parent's ends
    template <class F> explicit Child(F f)
    {
        int p2c[2], c2p[2];
        if (pipe(p2c) || pipe(c2p))
            return;
        fflush(nullptr);
        pid = fork();
        if (pid == 0) {
            close(p2c[1]);
            close(c2p[0]);
            int rc = f(p2c[0], c2p[1]);
            if (rc != 0) // a failed check may have left the device open
                shm_unlink(("/wemu-verbs-" + std::to_string(getpid())).c_str());
            _exit(rc);
        }
        close(p2c[0]);
        close(c2p[1]);
        rfd = c2p[0];
        wfd = p2c[1];
    }
    int wait()
    {
        int st = 0;
        if (pid <= 0)
            return -1;
        if (waitpid(pid, &st, 0) != pid)
            return -1;
        close(rfd);
        close(wfd);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
};

// ---- tests -------------------------------------------------------------------
TEST(EmuVerbs, ExportsOnlyVerbsNames)
{
    Api &a = api();
    EXPECT_EQ(dlsym(a.h, "load_config"), nullptr);
    EXPECT_EQ(dlsym(a.h, "g"), nullptr);
    EXPECT_EQ(dlsym(a.h, "exec_wr"), nullptr);
    EXPECT_NE(dlsym(a.h, "_ibv_query_gid_ex"), nullptr);
    EXPECT_STREQ(a.wc_status_str(IBV_WC_RETRY_EXC_ERR), "transport retry counter exceeded");
}

TEST(EmuVerbs, DeviceAndPortIB)
{
    WITH_KNOBS({{"WEFT_EMU_VERBS_MAX_MSG", "65536"}, {"WEFT_EMU_VERBS_MTU", "2048"}});
    int n = 0;
    ibv_device **l = api().get_device_list(&n);
    ASSERT_NE(l, nullptr);
    ASSERT_EQ(n, 1);
    EXPECT_EQ(l[1], nullptr);
    EXPECT_STREQ(api().get_device_name(l[0]), "emu_0");
    ibv_context *ctx = api().open_device(l[0]);
    api().free_device_list(l);
    ASSERT_NE(ctx, nullptr);
    EXPECT_TRUE(seg_exists(getpid()));
    ibv_device_attr da{};
    ASSERT_EQ(api().query_device(ctx, &da), 0);
    EXPECT_EQ(da.max_qp_wr, 16384);
    EXPECT_GE(da.max_sge, 4);
    EXPECT_EQ(da.max_cqe, 65536);
    EXPECT_EQ(da.phys_port_cnt, 1);
    ibv_port_attr pa{};
    ASSERT_EQ(api().query_port(ctx, 1, &pa), 0);
    EXPECT_EQ(pa.state, IBV_PORT_ACTIVE);
    EXPECT_EQ(pa.link_layer, IBV_LINK_LAYER_INFINIBAND);
    EXPECT_EQ(pa.max_msg_sz, 65536u);
    EXPECT_EQ(pa.active_mtu, IBV_MTU_2048);
    EXPECT_EQ(pa.max_mtu, IBV_MTU_4096);
    EXPECT_EQ(pa.lid, 1 + (getpid() & 0x3FFF));
    EXPECT_EQ(pa.gid_tbl_len, 1);
    EXPECT_NE(api().query_port(ctx, 2, &pa), 0);
    ibv_gid_entry e{};
    ASSERT_EQ(api().query_gid_ex(ctx, 1, 0, &e, 0, sizeof e), 0);
    EXPECT_EQ(e.gid_type, (uint32_t)IBV_GID_TYPE_IB);
    EXPECT_EQ(e.gid.raw[0], 0xfe);
    EXPECT_NE(api().query_gid_ex(ctx, 1, 1, &e, 0, sizeof e), 0);
    EXPECT_EQ(api().close_device(ctx), 0);
    EXPECT_FALSE(seg_exists(getpid()));
}

TEST(EmuVerbs, RoceGidTable)
{
    WITH_KNOBS({{"WEFT_EMU_VERBS_LINK", "roce"}});
    ibv_context *ctx = open_dev();
    ASSERT_NE(ctx, nullptr);
    ibv_port_attr pa{};
    ASSERT_EQ(api().query_port(ctx, 1, &pa), 0);
    EXPECT_EQ(pa.link_layer, IBV_LINK_LAYER_ETHERNET);
    EXPECT_EQ(pa.lid, 0);
    ASSERT_GE(pa.gid_tbl_len, 5);
    int v1 = 0, v2 = 0, ll = 0, v4 = 0, empty = 0;
    for (int i = 0; i < pa.gid_tbl_len; i++) {
        ibv_gid_entry e{};
        int rc = api().query_gid_ex(ctx, 1, (uint32_t)i, &e, 0, sizeof e);
        ibv_gid g{};
        ASSERT_EQ(api().query_gid(ctx, 1, i, &g), 0);
        if (rc == ENODATA) {
            empty++;
            static const uint8_t zero[16] = {};
            EXPECT_EQ(memcmp(g.raw, zero, 16), 0);
            continue;
        }
        ASSERT_EQ(rc, 0);
        EXPECT_EQ(memcmp(g.raw, e.gid.raw, 16), 0);
        EXPECT_EQ(e.gid_index, (uint32_t)i);
        v1 += e.gid_type == IBV_GID_TYPE_ROCE_V1;
        v2 += e.gid_type == IBV_GID_TYPE_ROCE_V2;
        ll += e.gid.raw[0] == 0xfe && e.gid.raw[1] == 0x80;
        v4 += e.gid.raw[10] == 0xff && e.gid.raw[11] == 0xff && e.gid.raw[0] == 0;
    }
    EXPECT_EQ(v1, 2);
    EXPECT_EQ(v2, 2);
    EXPECT_EQ(ll, 2);
    EXPECT_EQ(v4, 2);
    EXPECT_GE(empty, 1);
    EXPECT_EQ(api().close_device(ctx), 0);
}

TEST(EmuVerbs, RoceV1V2MismatchNeverConnects)
{
    WITH_KNOBS({{"WEFT_EMU_VERBS_LINK", "roce"}});
    Pair p;
    ASSERT_TRUE(p.ok());
    ConnOpts oa, ob;
    oa.sgid_index = 3; // IPv4-mapped, v2
    ob.sgid_index = 2; // IPv4-mapped, v1
    oa.timeout = ob.timeout = 8;
    oa.retry_cnt = ob.retry_cnt = 1;
    ASSERT_TRUE(p.connect(oa, ob));
    ASSERT_EQ(post_write(p.a, 1, p.bufa.data(), 64, p.mra->lkey, p.ab.addr, p.mrb->rkey), 0);
    ibv_wc wc{};
    ASSERT_EQ(poll_n(p.cqa, &wc, 1), 1);
    EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR);
}

TEST(EmuVerbs, RoceRequiresGrh)
{
    WITH_KNOBS({{"WEFT_EMU_VERBS_LINK", "roce"}});
    Pair p;
    ASSERT_TRUE(p.ok());
    ASSERT_EQ(to_init(p.a, 0), 0);
    Addr r = local_addr(p.ctx, p.b, 1, 3, nullptr, nullptr);
    ConnOpts o; // sgid_index -1: no GRH
    EXPECT_EQ(to_rtr(p.a, r, o), EINVAL);
    o.sgid_index = 6; // empty entry
    EXPECT_EQ(to_rtr(p.a, r, o), EINVAL);
    o.sgid_index = 1;
    EXPECT_EQ(to_rtr(p.a, r, o), 0);
}

TEST(EmuVerbs, DevicesAndPortDown)
{
    WITH_KNOBS({{"WEFT_EMU_VERBS_DEVICES", "mlx5_0,mlx5_1"}, {"WEFT_EMU_VERBS_PORT_DOWN", "mlx5_1"}});
    int n = 0;
    ibv_device **l = api().get_device_list(&n);
    ASSERT_EQ(n, 2);
    EXPECT_STREQ(api().get_device_name(l[1]), "mlx5_1");
    ibv_context *c0 = api().open_device(l[0]), *c1 = api().open_device(l[1]);
    api().free_device_list(l);
    ASSERT_TRUE(c0 && c1);
    ibv_port_attr p0{}, p1{};
    api().query_port(c0, 1, &p0);
    api().query_port(c1, 1, &p1);
    EXPECT_EQ(p0.state, IBV_PORT_ACTIVE);
    EXPECT_EQ(p1.state, IBV_PORT_DOWN);
    EXPECT_NE(p0.lid, p1.lid);
    // an MR of one device's PD is not usable on another device's QP
    ibv_pd *pd0 = api().alloc_pd(c0), *pd1 = api().alloc_pd(c1);
    ibv_cq *cq0 = api().create_cq(c0, 16, nullptr, nullptr, 0), *cq1 = api().create_cq(c1, 16, nullptr, nullptr, 0);
    ibv_qp *q1 = make_qp(pd1, cq1, cq1);
    ASSERT_NE(q1, nullptr);
    EXPECT_EQ(make_qp(pd0, cq1, cq1), nullptr) << "CQ of another context";
    ASSERT_EQ(to_init(q1, 0), 0);
    Addr r{};
    r.lid = p0.lid;
    r.qpn = q1->qp_num;
    EXPECT_NE(to_rtr(q1, r, ConnOpts()), 0) << "port is down";
    EXPECT_EQ(api().destroy_qp(q1), 0);
    EXPECT_EQ(api().destroy_cq(cq0), 0);
    EXPECT_EQ(api().destroy_cq(cq1), 0);
    EXPECT_EQ(api().dealloc_pd(pd0), 0);
    EXPECT_EQ(api().dealloc_pd(pd1), 0);
    EXPECT_EQ(api().close_device(c0), 0);
    EXPECT_TRUE(seg_exists(getpid())) << "one context still open";
    EXPECT_EQ(api().close_device(c1), 0);
    EXPECT_FALSE(seg_exists(getpid()));
}

TEST(EmuVerbs, QpStateMachineAndMasks)
{
    WITH_KNOBS({});
    Pair p;
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p.a->state, IBV_QPS_RESET);
    EXPECT_EQ(post_recv(p.a, 1, p.bufa.data(), 8, p.mra->lkey), EINVAL) << "post_recv in RESET";
    // RESET -> INIT without ACCESS_FLAGS
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_INIT;
    at.port_num = 1;
    EXPECT_EQ(api().modify_qp(p.a, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT), EINVAL);
    // RESET -> RTR skipping INIT
    Addr r = local_addr(p.ctx, p.b, 5, -1, nullptr, nullptr);
    EXPECT_EQ(to_rtr(p.a, r, ConnOpts()), EINVAL);
    ASSERT_EQ(to_init(p.a, IBV_ACCESS_REMOTE_WRITE), 0);
    EXPECT_EQ(p.a->state, IBV_QPS_INIT);
    EXPECT_EQ(post_recv(p.a, 1, p.bufa.data(), 8, p.mra->lkey), 0) << "post_recv in INIT";
    EXPECT_EQ(post_send(p.a, 1, p.bufa.data(), 8, p.mra->lkey), EINVAL) << "post_send below RTS";
    // INIT -> RTR without MIN_RNR_TIMER
    at = {};
    at.qp_state = IBV_QPS_RTR;
    at.path_mtu = IBV_MTU_1024;
    at.dest_qp_num = r.qpn;
    at.ah_attr.dlid = r.lid;
    EXPECT_EQ(api().modify_qp(p.a, &at,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC),
              EINVAL);
    // extra attribute not allowed in this transition
    EXPECT_EQ(api().modify_qp(p.a, &at,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER | IBV_QP_SQ_PSN),
              EINVAL);
    // path MTU out of range (MtuKnobLimitsPathMtu checks the port's active MTU)
    ConnOpts o;
    o.mtu = (ibv_mtu)6;
    EXPECT_EQ(to_rtr(p.a, r, o), EINVAL);
    Addr bad = r;
    bad.lid = 0;
    EXPECT_EQ(to_rtr(p.a, bad, ConnOpts()), EINVAL) << "dlid 0";
    bad.lid = 0xC001;
    EXPECT_EQ(to_rtr(p.a, bad, ConnOpts()), EINVAL) << "multicast dlid";
    ASSERT_EQ(to_rtr(p.a, r, ConnOpts()), 0);
    EXPECT_EQ(p.a->state, IBV_QPS_RTR);
    EXPECT_EQ(post_send(p.a, 1, p.bufa.data(), 8, p.mra->lkey), EINVAL) << "post_send in RTR";
    at = {};
    at.qp_state = IBV_QPS_RTS;
    EXPECT_EQ(api().modify_qp(p.a, &at, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT), EINVAL);
    ASSERT_EQ(to_rts(p.a, 7, ConnOpts()), 0);
    EXPECT_EQ(p.a->state, IBV_QPS_RTS);
    // back to RESET drops everything; INIT again works
    at = {};
    at.qp_state = IBV_QPS_RESET;
    ASSERT_EQ(api().modify_qp(p.a, &at, IBV_QP_STATE), 0);
    EXPECT_EQ(p.a->state, IBV_QPS_RESET);
    EXPECT_EQ(to_init(p.a, 0), 0);
    // destroy_cq / dealloc_pd while in use
    EXPECT_EQ(api().destroy_cq(p.cqa), EBUSY);
    EXPECT_EQ(api().dealloc_pd(p.pd), EBUSY);
    // unsupported QP type
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = p.cqa;
    ia.qp_type = IBV_QPT_UD;
    ia.cap.max_send_wr = 1;
    EXPECT_EQ(api().create_qp(p.pd, &ia), nullptr);
}

TEST(EmuVerbs, MtuKnobLimitsPathMtu)
{
    WITH_KNOBS({{"WEFT_EMU_VERBS_MTU", "1024"}});
    Pair p;
    ASSERT_TRUE(p.ok());
    ASSERT_EQ(to_init(p.a, 0), 0);
    Addr r = local_addr(p.ctx, p.b, 5, -1, nullptr, nullptr);
    ConnOpts o;
    o.mtu = IBV_MTU_2048;
    EXPECT_EQ(to_rtr(p.a, r, o), EINVAL);
    o.mtu = IBV_MTU_1024;
    EXPECT_EQ(to_rtr(p.a, r, o), 0);
}

// Two processes: SEND, SEND_WITH_IMM, RDMA_WRITE_WITH_IMM, RDMA_READ, with
// LID/QPN/PSN (or GID) exchanged through pipes.
class TwoProc : public ::testing::TestWithParam<const char *> {};

TEST_P(TwoProc, DataPath)
{
    bool roce = !strcmp(GetParam(), "roce");
    WITH_KNOBS({{"WEFT_EMU_VERBS_LINK", GetParam()}});
    const int sgid = roce ? 3 : -1;
    const size_t kBuf = 64 << 10;
    Child child([&](int rfd, int wfd) -> int {
        std::vector<uint8_t> buf(kBuf, 0);
        for (size_t i = 32768; i < 40960; i++)
            buf[i] = (uint8_t)(i * 7 + 3);
        ibv_context *ctx = open_dev();
        CCHECK(ctx);
        ibv_pd *pd = api().alloc_pd(ctx);
        ibv_cq *cq = api().create_cq(ctx, 64, nullptr, nullptr, 0);
        ibv_qp *qp = make_qp(pd, cq, cq);
        ibv_mr *mr = api().reg_mr(pd, buf.data(), kBuf,
                                  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
        CCHECK(pd && cq && qp && mr);
        CCHECK(to_init(qp, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ) == 0);
        CCHECK(post_recv(qp, 11, buf.data(), 4096, mr->lkey) == 0);
        CCHECK(post_recv(qp, 12, buf.data() + 4096, 4096, mr->lkey) == 0);
        CCHECK(post_recv(qp, 13, nullptr, 0, 0) == 0);
        Addr me = local_addr(ctx, qp, 0x123456, sgid, buf.data(), mr), peer{};
        CCHECK(write_all(wfd, &me, sizeof me) && read_all(rfd, &peer, sizeof peer));
        ConnOpts o;
        o.sgid_index = sgid;
        CCHECK(to_rtr(qp, peer, o) == 0 && to_rts(qp, me.psn, o) == 0);
        char ready = 'r';
        CCHECK(write_all(wfd, &ready, 1));
        ibv_wc wc[3];
        CCHECK(poll_n(cq, wc, 3) == 3);
        for (auto &w : wc)
            CCHECK(w.status == IBV_WC_SUCCESS && w.qp_num == qp->qp_num && w.src_qp == peer.qpn);
        CCHECK(wc[0].wr_id == 11 && wc[0].opcode == IBV_WC_RECV && wc[0].byte_len == 4096 &&
               !(wc[0].wc_flags & IBV_WC_WITH_IMM));
        CCHECK(wc[1].wr_id == 12 && wc[1].opcode == IBV_WC_RECV && wc[1].byte_len == 100 &&
               (wc[1].wc_flags & IBV_WC_WITH_IMM) && wc[1].imm_data == htonl(0x12345678));
        CCHECK(wc[2].wr_id == 13 && wc[2].opcode == IBV_WC_RECV_RDMA_WITH_IMM && wc[2].byte_len == 8192 &&
               (wc[2].wc_flags & IBV_WC_WITH_IMM) && wc[2].imm_data == 0xCAFEBABE);
        for (size_t i = 0; i < 4096; i++)
            CCHECK(buf[i] == (uint8_t)(i ^ 0x5a));
        for (size_t i = 0; i < 100; i++)
            CCHECK(buf[4096 + i] == (uint8_t)(i + 1));
        for (size_t i = 0; i < 8192; i++)
            CCHECK(buf[16384 + i] == (uint8_t)(i * 3));
        char done;
        CCHECK(read_all(rfd, &done, 1)); // the parent's READ is finished
        CCHECK(api().destroy_qp(qp) == 0 && api().dereg_mr(mr) == 0 && api().destroy_cq(cq) == 0 &&
               api().dealloc_pd(pd) == 0 && api().close_device(ctx) == 0);
        CCHECK(!seg_exists(getpid()));
        return 0;
    });
    ASSERT_GT(child.pid, 0);
    std::vector<uint8_t> buf(kBuf, 0);
    ibv_context *ctx = open_dev();
    ASSERT_NE(ctx, nullptr);
    ibv_pd *pd = api().alloc_pd(ctx);
    ibv_cq *cq = api().create_cq(ctx, 64, nullptr, nullptr, 0);
    ibv_qp *qp = make_qp(pd, cq, cq);
    ibv_mr *mr = api().reg_mr(pd, buf.data(), kBuf, IBV_ACCESS_LOCAL_WRITE);
    ASSERT_TRUE(pd && cq && qp && mr);
    Addr peer{};
    ASSERT_TRUE(read_all(child.rfd, &peer, sizeof peer));
    if (roce) {
        EXPECT_EQ(peer.lid, 0);
        EXPECT_EQ(peer.gid[10], 0xff);
    } else {
        EXPECT_EQ(peer.lid, 1 + (child.pid & 0x3FFF));
    }
    EXPECT_EQ(peer.qpn >> 16, (uint32_t)child.pid >> 14);
    Addr me = local_addr(ctx, qp, 0x654321, sgid, buf.data(), mr);
    ConnOpts o;
    o.sgid_index = sgid;
    ASSERT_EQ(to_init(qp, 0), 0);
    ASSERT_EQ(to_rtr(qp, peer, o), 0);
    ASSERT_EQ(to_rts(qp, me.psn, o), 0);
    ASSERT_TRUE(write_all(child.wfd, &me, sizeof me));
    char ready;
    ASSERT_TRUE(read_all(child.rfd, &ready, 1));
    for (size_t i = 0; i < 4096; i++)
        buf[i] = (uint8_t)(i ^ 0x5a);
    for (size_t i = 0; i < 100; i++)
        buf[4096 + i] = (uint8_t)(i + 1);
    for (size_t i = 0; i < 8192; i++)
        buf[8192 + i] = (uint8_t)(i * 3);
    ASSERT_EQ(post_send(qp, 1, buf.data(), 4096, mr->lkey), 0);
    ASSERT_EQ(post_send(qp, 2, buf.data() + 4096, 100, mr->lkey, IBV_SEND_SIGNALED, IBV_WR_SEND_WITH_IMM,
                        htonl(0x12345678)),
              0);
    ASSERT_EQ(post_write(qp, 3, buf.data() + 8192, 8192, mr->lkey, peer.addr + 16384, peer.rkey, IBV_SEND_SIGNALED,
                         IBV_WR_RDMA_WRITE_WITH_IMM, 0xCAFEBABE),
              0);
    ASSERT_EQ(post_write(qp, 4, buf.data() + 32768, 8192, mr->lkey, peer.addr + 32768, peer.rkey, IBV_SEND_SIGNALED,
                         IBV_WR_RDMA_READ),
              0);
    ibv_wc wc[4];
    ASSERT_EQ(poll_n(cq, wc, 4), 4);
    const ibv_wc_opcode ops[4] = {IBV_WC_SEND, IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ};
    for (int i = 0; i < 4; i++) {
        EXPECT_EQ(wc[i].status, IBV_WC_SUCCESS) << api().wc_status_str(wc[i].status);
        EXPECT_EQ(wc[i].wr_id, (uint64_t)i + 1);
        EXPECT_EQ(wc[i].opcode, ops[i]);
        EXPECT_EQ(wc[i].qp_num, qp->qp_num);
    }
    EXPECT_EQ(wc[3].byte_len, 8192u);
    for (size_t i = 32768; i < 40960; i++)
        ASSERT_EQ(buf[i], (uint8_t)(i * 7 + 3)) << i;
    char done = 'd';
    ASSERT_TRUE(write_all(child.wfd, &done, 1));
    EXPECT_EQ(child.wait(), 0);
    EXPECT_FALSE(seg_exists(child.pid));
    EXPECT_EQ(api().destroy_qp(qp), 0);
    EXPECT_EQ(api().dereg_mr(mr), 0);
    EXPECT_EQ(api().destroy_cq(cq), 0);
    EXPECT_EQ(api().dealloc_pd(pd), 0);
    EXPECT_EQ(api().close_device(ctx), 0);
    EXPECT_FALSE(seg_exists(getpid()));
}

INSTANTIATE_TEST_SUITE_P(Link, TwoProc, ::testing::Values("ib", "roce"));

TEST(EmuVerbs, SendRecvLoopbackMultiSge)
{
    WITH_KNOBS({});
    Pair p;
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(p.connect());
    for (int i = 0; i < 300; i++)
        p.bufa[i] = (uint8_t)(i + 9);
    // receive scattered into two SGEs
    ibv_sge rs[2] = {{(uintptr_t)p.bufb.data(), 100, p.mrb->lkey}, {(uintptr_t)p.bufb.data() + 1000, 200, p.mrb->lkey}};
    ibv_recv_wr rw{}, *rbad;
    rw.wr_id = 77;
    rw.sg_list = rs;
    rw.num_sge = 2;
    ASSERT_EQ(ibv_post_recv(p.b, &rw, &rbad), 0);
    ibv_sge ss[2] = {{(uintptr_t)p.bufa.data(), 150, p.mra->lkey}, {(uintptr_t)p.bufa.data() + 150, 150, p.mra->lkey}};
    ibv_send_wr sw{}, *sbad;
    sw.wr_id = 5;
    sw.sg_list = ss;
    sw.num_sge = 2;
    sw.opcode = IBV_WR_SEND;
    sw.send_flags = IBV_SEND_SIGNALED;
    ASSERT_EQ(ibv_post_send(p.a, &sw, &sbad), 0);
    ibv_wc wc{};
    ASSERT_EQ(poll_n(p.cqa, &wc, 1), 1);
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    ASSERT_EQ(poll_n(p.rcqb, &wc, 1), 1);
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.byte_len, 300u);
    EXPECT_EQ(wc.wr_id, 77u);
    for (int i = 0; i < 100; i++)
        ASSERT_EQ(p.bufb[i], (uint8_t)(i + 9));
    for (int i = 0; i < 200; i++)
        ASSERT_EQ(p.bufb[1000 + i], (uint8_t)(i + 100 + 9));
    // zero-byte SEND with no SGE
    ASSERT_EQ(post_recv(p.b, 78, nullptr, 0, 0), 0);
    ASSERT_EQ(post_send(p.a, 6, nullptr, 0, 0), 0);
    ASSERT_EQ(poll_n(p.cqa, &wc, 1), 1);
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    ASSERT_EQ(poll_n(p.rcqb, &wc, 1), 1);
    EXPECT_EQ(wc.byte_len, 0u);
    // receive queue depth: 64
    for (int i = 0; i < 64; i++)
        ASSERT_EQ(post_recv(p.b, 100 + (uint64_t)i, p.bufb.data(), 8, p.mrb->lkey), 0);
    ibv_recv_wr extra{}, *eb = nullptr;
    extra.wr_id = 999;
    EXPECT_EQ(ibv_post_recv(p.b, &extra, &eb), ENOMEM);
    EXPECT_EQ(eb, &extra);
    // too many SGEs
    ibv_sge many[5] = {};
    extra.sg_list = many;
    extra.num_sge = 5;
    EXPECT_EQ(ibv_post_recv(p.a, &extra, &eb), EINVAL);
}

TEST(EmuVerbs, BadRkeyAndRemoteBounds)
{
    WITH_KNOBS({});
    for (int variant = 0; variant < 3; variant++) {
        Pair p;
        ASSERT_TRUE(p.ok());
        ASSERT_TRUE(p.connect());
        ASSERT_EQ(post_recv(p.b, 50, p.bufb.data(), 64, p.mrb->lkey), 0);
        uint64_t raddr = p.ab.addr;
        uint32_t rkey = p.mrb->rkey;
        ibv_wr_opcode op = IBV_WR_RDMA_WRITE;
        if (variant == 0)
            rkey += 1; // stale key byte
        else if (variant == 1)
            raddr += Pair::kBuf - 8; // 16 bytes, 8 past the end
        else
            op = IBV_WR_RDMA_READ, raddr -= 1;
        ASSERT_EQ(post_write(p.a, 9, p.bufa.data(), 16, p.mra->lkey, raddr, rkey, IBV_SEND_SIGNALED, op), 0);
        ibv_wc wc{};
        ASSERT_EQ(poll_n(p.cqa, &wc, 1), 1);
        EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << variant;
        EXPECT_EQ(wc.wr_id, 9u);
        EXPECT_EQ(wc.qp_num, p.a->qp_num);
        // the responder QP went to error: its posted receive is flushed
        ASSERT_EQ(poll_n(p.rcqb, &wc, 1), 1);
        EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
        EXPECT_EQ(wc.wr_id, 50u);
        EXPECT_EQ(wc.qp_num, p.b->qp_num);
    }
}

TEST(EmuVerbs, AccessFlagsOfMrAndQp)
{
    WITH_KNOBS({});
    {
        Pair p(64, 0, 256, IBV_ACCESS_LOCAL_WRITE); // b's MR: no remote access
        ASSERT_TRUE(p.ok());
        ASSERT_TRUE(p.connect());
        ASSERT_EQ(post_write(p.a, 1, p.bufa.data(), 16, p.mra->lkey, p.ab.addr, p.mrb->rkey), 0);
        ibv_wc wc{};
        ASSERT_EQ(poll_n(p.cqa, &wc, 1), 1);
        EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR);
    }
    {
        Pair p(64, 0, 256, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE); // no REMOTE_READ
        ASSERT_TRUE(p.ok());
        ASSERT_TRUE(p.connect());
        ASSERT_EQ(post_write(p.a, 1, p.bufa.data(), 16, p.mra->lkey, p.ab.addr, p.mrb->rkey), 0);
        ASSERT_EQ(post_write(p.a, 2, p.bufa.data(), 16, p.mra->lkey, p.ab.addr, p.mrb->rkey, IBV_SEND_SIGNALED,
                             IBV_WR_RDMA_READ),
                  0);
        ibv_wc wc[2];
        ASSERT_EQ(poll_n(p.cqa, wc, 2), 2);
        EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
        EXPECT_EQ(wc[1].status, IBV_WC_REM_ACCESS_ERR);
    }
    {
        Pair p; // QP b without REMOTE_WRITE in its access flags
        ASSERT_TRUE(p.ok());
        ConnOpts ob;
        ob.access = IBV_ACCESS_REMOTE_READ;
        ASSERT_TRUE(p.connect(ConnOpts(), ob));
        ASSERT_EQ(post_write(p.a, 1, p.bufa.data(), 16, p.mra->lkey, p.ab.addr, p.mrb->rkey), 0);
        ibv_wc wc{};
        ASSERT_EQ(poll_n(p.cqa, &wc, 1), 1);
        EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR);
    }
    // REMOTE_WRITE without LOCAL_WRITE is refused at registration
    Pair p;
    ASSERT_TRUE(p.ok());
    errno = 0;
    EXPECT_EQ(api().reg_mr(p.pd, p.bufa.data(), 64, IBV_ACCESS_REMOTE_WRITE), nullptr);
    EXPECT_EQ(errno, EINVAL);
}

TEST(EmuVerbs, LocalProtection)
{
    WITH_KNOBS({});
    for (int variant = 0; variant < 3; variant++) {
        Pair p;
        ASSERT_TRUE(p.ok());
        ASSERT_TRUE(p.connect());
        ibv_mr *ro = api().reg_mr(p.pd, p.bufa.data(), 4096, 0); // local read only
        ASSERT_NE(ro, nullptr);
        int rc;
        if (variant == 0) // bad lkey
            rc = post_write(p.a, 3, p.bufa.data(), 16, p.mra->lkey ^ 0x100, p.ab.addr, p.mrb->rkey);
        else if (variant == 1) // outside the local MR
            rc = post_write(p.a, 3, p.bufa.data() + 4090, 16, ro->lkey, p.ab.addr, p.mrb->rkey);
        else // READ into memory without LOCAL_WRITE
            rc = post_write(p.a, 3, p.bufa.data(), 16, ro->lkey, p.ab.addr, p.mrb->rkey, IBV_SEND_SIGNALED,
                            IBV_WR_RDMA_READ);
        ASSERT_EQ(rc, 0);
        ibv_wc wc{};
        ASSERT_EQ(poll_n(p.cqa, &wc, 1), 1);
        EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << variant;
        EXPECT_EQ(api().dereg_mr(ro), 0);
    }
}

TEST(EmuVerbs, RecvTooSmall)
{
    WITH_KNOBS({});
    Pair p;
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(p.connect());
    ASSERT_EQ(post_recv(p.b, 21, p.bufb.data(), 16, p.mrb->lkey), 0);
    ASSERT_EQ(post_send(p.a, 22, p.bufa.data(), 64, p.mra->lkey), 0);
    ibv_wc wc{};
    ASSERT_EQ(poll_n(p.cqa, &wc, 1), 1);
    EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR);
    ASSERT_EQ(poll_n(p.rcqb, &wc, 1), 1);
    EXPECT_EQ(wc.status, IBV_WC_LOC_LEN_ERR);
    EXPECT_EQ(wc.wr_id, 21u);
}

TEST(EmuVerbs, RnrRetryExceededAndInfinite)
{
    WITH_KNOBS({});
    {
        Pair p;
        ASSERT_TRUE(p.ok());
        ConnOpts oa, ob;
        oa.rnr_retry = 2;
        ob.min_rnr_timer = 14; // 1.28 ms: 2.56 ms in all
        ASSERT_TRUE(p.connect(oa, ob));
        double t0 = now_s();
        ASSERT_EQ(post_send(p.a, 1, p.bufa.data(), 8, p.mra->lkey), 0);
        ibv_wc wc{};
        ASSERT_EQ(poll_n(p.cqa, &wc, 1), 1);
        EXPECT_EQ(wc.status, IBV_WC_RNR_RETRY_EXC_ERR);
        EXPECT_GE(now_s() - t0, 0.0025);
        // RDMA_WRITE_WITH_IMM needs a receive too
    }
    {
        Pair p;
        ASSERT_TRUE(p.ok());
        ConnOpts oa;
        oa.rnr_retry = 0;
        ASSERT_TRUE(p.connect(oa));
        ASSERT_EQ(post_write(p.a, 1, p.bufa.data(), 8, p.mra->lkey, p.ab.addr, p.mrb->rkey, IBV_SEND_SIGNALED,
                             IBV_WR_RDMA_WRITE_WITH_IMM, 1),
                  0);
        ibv_wc wc{};
        ASSERT_EQ(poll_n(p.cqa, &wc, 1), 1);
        EXPECT_EQ(wc.status, IBV_WC_RNR_RETRY_EXC_ERR);
    }
    {
        Pair p;
        ASSERT_TRUE(p.ok());
        ASSERT_TRUE(p.connect()); // rnr_retry 7: forever
        ASSERT_EQ(post_send(p.a, 1, p.bufa.data(), 8, p.mra->lkey), 0);
        ibv_wc wc{};
        EXPECT_EQ(poll_n(p.cqa, &wc, 1, 0.05), 0);
        ASSERT_EQ(post_recv(p.b, 2, p.bufb.data(), 8, p.mrb->lkey), 0);
        ASSERT_EQ(poll_n(p.cqa, &wc, 1), 1);
        EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    }
}

TEST(EmuVerbs, RetryExceededWhenPeerNotConnected)
{
    WITH_KNOBS({});
    ConnOpts oa;
    oa.timeout = 10; // 4.2 ms
    oa.retry_cnt = 2; // x3
    for (int variant = 0; variant < 4; variant++) {
        Pair p;
        ASSERT_TRUE(p.ok());
        p.aa = local_addr(p.ctx, p.a, 100, -1, p.bufa.data(), p.mra);
        p.ab = local_addr(p.ctx, p.b, 200, -1, p.bufb.data(), p.mrb);
        ASSERT_EQ(to_init(p.a, oa.access), 0);
        ASSERT_EQ(to_init(p.b, oa.access), 0);
        ASSERT_EQ(to_rtr(p.a, p.ab, oa), 0);
        ASSERT_EQ(to_rts(p.a, 100, oa), 0);
        Addr back = p.aa;
        if (variant == 1)
            back.psn = 101; // b expects another PSN
        else if (variant == 2)
            back.qpn = p.b->qp_num; // b points elsewhere
        else if (variant == 3)
            back.lid = (uint16_t)(back.lid + 1);
        if (variant != 0) { // variant 0: b stays in INIT
            ASSERT_EQ(to_rtr(p.b, back, ConnOpts()), 0);
        }
        double t0 = now_s();
        ASSERT_EQ(post_write(p.a, 1, p.bufa.data(), 8, p.mra->lkey, p.ab.addr, p.mrb->rkey), 0);
        ibv_wc wc{};
        ASSERT_EQ(poll_n(p.cqa, &wc, 1), 1);
        EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << variant;
        double dt = now_s() - t0;
        EXPECT_GE(dt, 0.012) << variant;
        EXPECT_LT(dt, 2.5) << variant;
    }
    // the same pair connected properly works
    Pair p;
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(p.connect(oa, oa));
    ASSERT_EQ(post_write(p.a, 1, p.bufa.data(), 8, p.mra->lkey, p.ab.addr, p.mrb->rkey), 0);
    ibv_wc wc{};
    ASSERT_EQ(poll_n(p.cqa, &wc, 1), 1);
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
}

TEST(EmuVerbs, MaxMsgSize)
{
    WITH_KNOBS({{"WEFT_EMU_VERBS_MAX_MSG", "64K"}});
    Pair p;
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(p.connect());
    ibv_port_attr pa{};
    api().query_port(p.ctx, 1, &pa);
    EXPECT_EQ(pa.max_msg_sz, 65536u);
    ASSERT_EQ(post_write(p.a, 1, p.bufa.data(), 65536, p.mra->lkey, p.ab.addr, p.mrb->rkey), 0);
    ASSERT_EQ(post_write(p.a, 2, p.bufa.data(), 65537, p.mra->lkey, p.ab.addr, p.mrb->rkey), 0);
    ibv_wc wc[2];
    ASSERT_EQ(poll_n(p.cqa, wc, 2), 2);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc[1].status, IBV_WC_LOC_LEN_ERR);
}

TEST(EmuVerbs, SendQueueOverflow)
{
    WITH_KNOBS({{"WEFT_EMU_VERBS_MAX_QP_WR", "4"}});
    {
        Pair p(4);
        ASSERT_TRUE(p.ok());
        ibv_device_attr da{};
        api().query_device(p.ctx, &da);
        EXPECT_EQ(da.max_qp_wr, 4);
        EXPECT_EQ(make_qp(p.pd, p.cqa, p.cqa, 5, 4), nullptr);
        ASSERT_TRUE(p.connect());
        ibv_sge s{(uintptr_t)p.bufa.data(), 8, p.mra->lkey};
        ibv_send_wr wr[5]{}, *bad = nullptr;
        for (int i = 0; i < 5; i++) {
            wr[i].wr_id = (uint64_t)i;
            wr[i].sg_list = &s;
            wr[i].num_sge = 1;
            wr[i].opcode = IBV_WR_RDMA_WRITE;
            wr[i].send_flags = IBV_SEND_SIGNALED;
            wr[i].wr.rdma.remote_addr = p.ab.addr;
            wr[i].wr.rdma.rkey = p.mrb->rkey;
            wr[i].next = i < 4 ? &wr[i + 1] : nullptr;
        }
        EXPECT_EQ(ibv_post_send(p.a, &wr[0], &bad), ENOMEM);
        EXPECT_EQ(bad, &wr[4]);
        ibv_wc wc[5];
        ASSERT_EQ(poll_n(p.cqa, wc, 5, 0.1), 4) << "the first four were posted";
        bad = nullptr;
        EXPECT_EQ(ibv_post_send(p.a, &wr[1], &bad), 0) << "room again after polling";
        ASSERT_EQ(poll_n(p.cqa, wc, 4), 4);
    }
    {
        // unsignaled WRs hold their slots until a later signaled CQE is polled
        Pair p(4);
        ASSERT_TRUE(p.ok());
        ASSERT_TRUE(p.connect());
        for (int i = 0; i < 4; i++)
            ASSERT_EQ(post_write(p.a, (uint64_t)i, p.bufa.data(), 8, p.mra->lkey, p.ab.addr, p.mrb->rkey, 0), 0);
        EXPECT_EQ(post_write(p.a, 9, p.bufa.data(), 8, p.mra->lkey, p.ab.addr, p.mrb->rkey), ENOMEM);
        ibv_wc wc[4];
        EXPECT_EQ(poll_n(p.cqa, wc, 4, 0.05), 0) << "executed, no completions";
        EXPECT_EQ(post_write(p.a, 9, p.bufa.data(), 8, p.mra->lkey, p.ab.addr, p.mrb->rkey), ENOMEM)
            << "unsignaled slots are not freed by execution alone";
    }
    {
        Pair p(4);
        ASSERT_TRUE(p.ok());
        ASSERT_TRUE(p.connect());
        for (int i = 0; i < 3; i++)
            ASSERT_EQ(post_write(p.a, (uint64_t)i, p.bufa.data(), 8, p.mra->lkey, p.ab.addr, p.mrb->rkey, 0), 0);
        ASSERT_EQ(post_write(p.a, 3, p.bufa.data(), 8, p.mra->lkey, p.ab.addr, p.mrb->rkey), 0);
        EXPECT_EQ(post_write(p.a, 4, p.bufa.data(), 8, p.mra->lkey, p.ab.addr, p.mrb->rkey), ENOMEM);
        ibv_wc wc[4];
        ASSERT_EQ(poll_n(p.cqa, wc, 1), 1);
        EXPECT_EQ(wc[0].wr_id, 3u);
        EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
        for (int i = 0; i < 4; i++)
            EXPECT_EQ(post_write(p.a, 10 + (uint64_t)i, p.bufa.data(), 8, p.mra->lkey, p.ab.addr, p.mrb->rkey,
                                 i == 3 ? IBV_SEND_SIGNALED : 0),
                      0)
                << i;
        ASSERT_EQ(poll_n(p.cqa, wc, 1), 1);
        EXPECT_EQ(wc[0].wr_id, 13u);
    }
}

TEST(EmuVerbs, InlineLimitAndCopyAtPost)
{
    WITH_KNOBS({{"WEFT_EMU_VERBS_MAX_INLINE", "128"}});
    Pair p(64, 64);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(make_qp(p.pd, p.cqa, p.cqa, 4, 4, 129), nullptr) << "above the device's inline size";
    ASSERT_TRUE(p.connect());
    uint8_t src[65];
    memset(src, 0xab, sizeof src);
    EXPECT_EQ(post_write(p.a, 1, src, 65, 0, p.ab.addr, p.mrb->rkey, IBV_SEND_SIGNALED | IBV_SEND_INLINE), EINVAL);
    // inline: no lkey needed, data taken at post time
    ASSERT_EQ(post_write(p.a, 2, src, 64, 0, p.ab.addr, p.mrb->rkey, IBV_SEND_SIGNALED | IBV_SEND_INLINE), 0);
    memset(src, 0x11, sizeof src);
    ibv_wc wc{};
    ASSERT_EQ(poll_n(p.cqa, &wc, 1), 1);
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    for (int i = 0; i < 64; i++)
        ASSERT_EQ(p.bufb[i], 0xab) << i;
    EXPECT_EQ(p.bufb[64], 0);
}

TEST(EmuVerbs, FlushAfterErrorAndGarbageFields)
{
    WITH_KNOBS({});
    Pair p;
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(p.connect());
    ASSERT_EQ(post_recv(p.a, 70, p.bufa.data(), 8, p.mra->lkey), 0);
    ASSERT_EQ(post_write(p.a, 1, p.bufa.data(), 8, p.mra->lkey, p.ab.addr, p.mrb->rkey + 1), 0);
    ASSERT_EQ(post_write(p.a, 2, p.bufa.data(), 8, p.mra->lkey, p.ab.addr, p.mrb->rkey, 0), 0); // unsignaled
    ASSERT_EQ(post_send(p.a, 3, p.bufa.data(), 8, p.mra->lkey), 0);
    ibv_wc wc[3];
    ASSERT_EQ(poll_n(p.cqa, wc, 3), 3);
    EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR) << "an unsignaled WR is completed when flushed";
    EXPECT_EQ(wc[1].wr_id, 2u);
    EXPECT_EQ(wc[2].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(wc[2].wr_id, 3u);
    for (auto &w : wc) {
        EXPECT_EQ(w.qp_num, p.a->qp_num);
        EXPECT_NE(w.opcode, IBV_WC_RDMA_WRITE) << "opcode is not valid in an error completion";
        EXPECT_EQ(w.byte_len, 0xBADC0DEu);
    }
    // a's posted receive is flushed too, and later posts complete flushed
    ASSERT_EQ(poll_n(p.rcqa, wc, 1), 1);
    EXPECT_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(wc[0].wr_id, 70u);
    ASSERT_EQ(post_recv(p.a, 71, p.bufa.data(), 8, p.mra->lkey), 0);
    ASSERT_EQ(poll_n(p.rcqa, wc, 1), 1);
    EXPECT_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(wc[0].wr_id, 71u);
    ASSERT_EQ(post_send(p.a, 4, p.bufa.data(), 8, p.mra->lkey, 0), 0) << "posting in ERR is allowed";
    ASSERT_EQ(poll_n(p.cqa, wc, 1), 1);
    EXPECT_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(wc[0].wr_id, 4u);
    // explicit modify to ERR flushes receives as well
    ASSERT_EQ(post_recv(p.b, 80, p.bufb.data(), 8, p.mrb->lkey), 0);
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_ERR;
    ASSERT_EQ(api().modify_qp(p.b, &at, IBV_QP_STATE), 0);
    ASSERT_EQ(poll_n(p.rcqb, wc, 1), 1);
    EXPECT_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(wc[0].wr_id, 80u);
}

TEST(EmuVerbs, FailWrKnob)
{
    {
        WITH_KNOBS({{"WEFT_EMU_VERBS_FAIL_WR", "3"}, {"WEFT_EMU_VERBS_FAIL_STATUS", "10"}});
        Pair p;
        ASSERT_TRUE(p.ok());
        ASSERT_TRUE(p.connect());
        for (int i = 1; i <= 4; i++)
            ASSERT_EQ(post_write(p.a, (uint64_t)i, p.bufa.data(), 8, p.mra->lkey, p.ab.addr, p.mrb->rkey), 0);
        ibv_wc wc[4];
        ASSERT_EQ(poll_n(p.cqa, wc, 4), 4);
        EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
        EXPECT_EQ(wc[1].status, IBV_WC_SUCCESS);
        EXPECT_EQ(wc[2].status, IBV_WC_REM_ACCESS_ERR);
        EXPECT_EQ(wc[2].wr_id, 3u);
        EXPECT_EQ(wc[3].status, IBV_WC_WR_FLUSH_ERR);
    }
}

// FailWrKnob's knob with FAULT_RANK (each its own test: the knobs of a
// process are those it started with)
TEST(EmuVerbs, FailWrKnobFaultRankElsewhere)
{
    {
        // FAULT_RANK names another rank: no fault here
        WITH_KNOBS({{"WEFT_EMU_VERBS_FAIL_WR", "1"}, {"WEFT_EMU_VERBS_FAULT_RANK", "1"}, {"OMPI_COMM_WORLD_RANK", "0"}});
        Pair p;
        ASSERT_TRUE(p.ok());
        ASSERT_TRUE(p.connect());
        ASSERT_EQ(post_write(p.a, 1, p.bufa.data(), 8, p.mra->lkey, p.ab.addr, p.mrb->rkey), 0);
        ibv_wc wc{};
        ASSERT_EQ(poll_n(p.cqa, &wc, 1), 1);
        EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    }
}

TEST(EmuVerbs, FailWrKnobFaultRankHere)
{
    {
        WITH_KNOBS({{"WEFT_EMU_VERBS_FAIL_WR", "1"}, {"WEFT_EMU_VERBS_FAULT_RANK", "2"}, {"PMIX_RANK", "2"}});
        Pair p;
        ASSERT_TRUE(p.ok());
        ASSERT_TRUE(p.connect());
        ASSERT_EQ(post_write(p.a, 1, p.bufa.data(), 8, p.mra->lkey, p.ab.addr, p.mrb->rkey), 0);
        ibv_wc wc{};
        ASSERT_EQ(poll_n(p.cqa, &wc, 1), 1);
        EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << "default FAIL_STATUS";
    }
}

// The child (forked) drops after its 2nd SEND. Both processes have the knob
// (the knobs of a process are those it started with), but this side posts
// one send WR only (the RDMA write below), so it never reaches a 2nd.
TEST(EmuVerbs, DropAfterKnob)
{
    WITH_KNOBS({{"WEFT_EMU_VERBS_DROP_AFTER", "2"}});
    Child child([&](int rfd, int wfd) -> int {
        std::vector<uint8_t> buf(4096, 1);
        ibv_context *ctx = open_dev();
        CCHECK(ctx);
        ibv_pd *pd = api().alloc_pd(ctx);
        ibv_cq *cq = api().create_cq(ctx, 64, nullptr, nullptr, 0);
        ibv_qp *qp = make_qp(pd, cq, cq);
        ibv_mr *mr = api().reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        CCHECK(pd && cq && qp && mr);
        CCHECK(to_init(qp, IBV_ACCESS_REMOTE_WRITE) == 0);
        CCHECK(post_recv(qp, 40, buf.data(), 64, mr->lkey) == 0);
        Addr me = local_addr(ctx, qp, 1, -1, buf.data(), mr), peer{};
        CCHECK(write_all(wfd, &me, sizeof me) && read_all(rfd, &peer, sizeof peer));
        ConnOpts o;
        o.timeout = 10; // 4.2 ms x 2
        o.retry_cnt = 1;
        CCHECK(to_rtr(qp, peer, o) == 0 && to_rts(qp, 1, o) == 0);
        char c;
        CCHECK(read_all(rfd, &c, 1)); // parent ready
        for (int i = 0; i < 3; i++)
            CCHECK(post_send(qp, 30 + (uint64_t)i, buf.data(), 16, mr->lkey) == 0);
        ibv_wc wc[4];
        double t0 = now_s();
        CCHECK(poll_n(cq, wc, 4) == 4);
        CCHECK(wc[0].status == IBV_WC_SUCCESS && wc[0].wr_id == 30);
        CCHECK(wc[1].status == IBV_WC_SUCCESS && wc[1].wr_id == 31);
        // the third times out, then the QP's receive is flushed
        CCHECK(wc[2].status == IBV_WC_RETRY_EXC_ERR && wc[2].wr_id == 32);
        CCHECK(wc[3].status == IBV_WC_WR_FLUSH_ERR && wc[3].wr_id == 40);
        CCHECK(now_s() - t0 >= 0.008);
        c = 'x';
        CCHECK(write_all(wfd, &c, 1)); // dropped
        CCHECK(read_all(rfd, &c, 1));  // parent done
        CCHECK(api().destroy_qp(qp) == 0 && api().dereg_mr(mr) == 0 && api().destroy_cq(cq) == 0 &&
               api().dealloc_pd(pd) == 0 && api().close_device(ctx) == 0);
        return 0;
    });
    ASSERT_GT(child.pid, 0);
    std::vector<uint8_t> buf(4096, 0);
    ibv_context *ctx = open_dev();
    ASSERT_NE(ctx, nullptr);
    ibv_pd *pd = api().alloc_pd(ctx);
    ibv_cq *cq = api().create_cq(ctx, 64, nullptr, nullptr, 0);
    ibv_qp *qp = make_qp(pd, cq, cq);
    ibv_mr *mr = api().reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
    ASSERT_TRUE(pd && cq && qp && mr);
    ASSERT_EQ(to_init(qp, 0), 0);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(post_recv(qp, 60 + (uint64_t)i, buf.data() + 64 * i, 64, mr->lkey), 0);
    Addr peer{};
    ASSERT_TRUE(read_all(child.rfd, &peer, sizeof peer));
    Addr me = local_addr(ctx, qp, 1, -1, buf.data(), mr);
    ConnOpts o;
    o.timeout = 12; // 16.8 ms x 2
    o.retry_cnt = 1;
    ASSERT_EQ(to_rtr(qp, peer, o), 0);
    ASSERT_EQ(to_rts(qp, 1, o), 0);
    ASSERT_TRUE(write_all(child.wfd, &me, sizeof me));
    char c = 'g';
    ASSERT_TRUE(write_all(child.wfd, &c, 1));
    ASSERT_TRUE(read_all(child.rfd, &c, 1)); // child has dropped
    ibv_wc wc[2];
    ASSERT_EQ(poll_n(cq, wc, 2), 2);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc[1].status, IBV_WC_SUCCESS);
    EXPECT_EQ(poll_n(cq, wc, 1, 0.02), 0) << "the third SEND never arrived";
    double t0 = now_s();
    ASSERT_EQ(post_write(qp, 5, buf.data(), 8, mr->lkey, peer.addr, peer.rkey), 0);
    ASSERT_EQ(poll_n(cq, wc, 2), 2);
    EXPECT_EQ(wc[0].status, IBV_WC_RETRY_EXC_ERR);
    EXPECT_EQ(wc[0].wr_id, 5u);
    EXPECT_GE(now_s() - t0, 0.03);
    EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR) << "then the receive left over is flushed";
    EXPECT_EQ(wc[1].wr_id, 62u);
    c = 'd';
    ASSERT_TRUE(write_all(child.wfd, &c, 1));
    EXPECT_EQ(child.wait(), 0);
    EXPECT_FALSE(seg_exists(child.pid));
    EXPECT_EQ(api().destroy_qp(qp), 0);
    EXPECT_EQ(api().dereg_mr(mr), 0);
    EXPECT_EQ(api().destroy_cq(cq), 0);
    EXPECT_EQ(api().dealloc_pd(pd), 0);
    EXPECT_EQ(api().close_device(ctx), 0);
    EXPECT_FALSE(seg_exists(getpid()));
}

TEST(EmuVerbs, PeerExitGivesRetryExceeded)
{
    WITH_KNOBS({});
    Child child([&](int rfd, int wfd) -> int {
        std::vector<uint8_t> buf(4096, 1);
        ibv_context *ctx = open_dev();
        CCHECK(ctx);
        ibv_pd *pd = api().alloc_pd(ctx);
        ibv_cq *cq = api().create_cq(ctx, 64, nullptr, nullptr, 0);
        ibv_qp *qp = make_qp(pd, cq, cq);
        ibv_mr *mr = api().reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        CCHECK(pd && cq && qp && mr);
        CCHECK(to_init(qp, IBV_ACCESS_REMOTE_WRITE) == 0);
        Addr me = local_addr(ctx, qp, 1, -1, buf.data(), mr), peer{};
        CCHECK(write_all(wfd, &me, sizeof me) && read_all(rfd, &peer, sizeof peer));
        CCHECK(to_rtr(qp, peer, ConnOpts()) == 0);
        CCHECK(api().close_device(ctx) == 0); // leaves the fabric (objects leak: the process ends)
        char c = 'x';
        CCHECK(write_all(wfd, &c, 1));
        return 0;
    });
    ASSERT_GT(child.pid, 0);
    std::vector<uint8_t> buf(4096, 0);
    ibv_context *ctx = open_dev();
    ASSERT_NE(ctx, nullptr);
    ibv_pd *pd = api().alloc_pd(ctx);
    ibv_cq *cq = api().create_cq(ctx, 64, nullptr, nullptr, 0);
    ibv_qp *qp = make_qp(pd, cq, cq);
    ibv_mr *mr = api().reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
    ASSERT_TRUE(pd && cq && qp && mr);
    Addr peer{};
    ASSERT_TRUE(read_all(child.rfd, &peer, sizeof peer));
    Addr me = local_addr(ctx, qp, 1, -1, buf.data(), mr);
    ConnOpts o;
    o.timeout = 12;
    o.retry_cnt = 1;
    ASSERT_EQ(to_init(qp, 0), 0);
    ASSERT_EQ(to_rtr(qp, peer, o), 0);
    ASSERT_EQ(to_rts(qp, 1, o), 0);
    ASSERT_TRUE(write_all(child.wfd, &me, sizeof me));
    char c;
    ASSERT_TRUE(read_all(child.rfd, &c, 1));
    EXPECT_EQ(child.wait(), 0);
    EXPECT_FALSE(seg_exists(child.pid));
    ASSERT_EQ(post_write(qp, 5, buf.data(), 8, mr->lkey, peer.addr, peer.rkey), 0);
    ibv_wc wc{};
    ASSERT_EQ(poll_n(cq, &wc, 1), 1);
    EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR);
    EXPECT_EQ(api().destroy_qp(qp), 0);
    EXPECT_EQ(api().dereg_mr(mr), 0);
    EXPECT_EQ(api().destroy_cq(cq), 0);
    EXPECT_EQ(api().dealloc_pd(pd), 0);
    EXPECT_EQ(api().close_device(ctx), 0);
}

TEST(EmuVerbs, CqOverrun)
{
    WITH_KNOBS({});
    ibv_wc wc[8];
    {
        Pair p(64, 0, 2); // cqa holds 3 (next power of two minus one)
        ASSERT_TRUE(p.ok());
        EXPECT_EQ(p.cqa->cqe, 3);
        ASSERT_TRUE(p.connect());
        for (int i = 0; i < 5; i++)
            ASSERT_EQ(post_write(p.a, (uint64_t)i, p.bufa.data(), 8, p.mra->lkey, p.ab.addr, p.mrb->rkey), 0);
        EXPECT_EQ(ibv_poll_cq(p.cqa, 8, wc), -1);
        EXPECT_EQ(ibv_poll_cq(p.cqa, 8, wc), -1) << "stays broken";
        // the QP using it went to error: its receives are flushed
        ASSERT_EQ(post_recv(p.a, 9, p.bufa.data(), 8, p.mra->lkey), 0);
        ASSERT_EQ(poll_n(p.rcqa, wc, 1), 1);
        EXPECT_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
    }
    // a CQ that is just full enough is fine
    Pair q(64, 0, 3);
    ASSERT_TRUE(q.ok());
    ASSERT_TRUE(q.connect());
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(post_write(q.a, (uint64_t)i, q.bufa.data(), 8, q.mra->lkey, q.ab.addr, q.mrb->rkey), 0);
    EXPECT_EQ(poll_n(q.cqa, wc, 3), 3);
}

// verbs are thread-safe: one thread sends and polls its send CQ while
// another posts receives and polls the receive CQ of the same context
TEST(EmuVerbs, TwoThreadsOneContext)
{
    WITH_KNOBS({});
    Pair p;
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(p.connect());
    const int kMsgs = 2000;
    int recv_ok = 0, send_ok = 0;
    std::thread rx([&] {
        int posted = 0, done = 0;
        double end = now_s() + 10;
        while (done < kMsgs && now_s() < end) {
            while (posted < kMsgs && posted - done < 32) {
                if (post_recv(p.b, (uint64_t)posted, p.bufb.data() + 8 * (posted % 64), 8, p.mrb->lkey) != 0)
                    return;
                posted++;
            }
            ibv_wc wc[16];
            int n = ibv_poll_cq(p.rcqb, 16, wc);
            if (n < 0)
                return;
            for (int i = 0; i < n; i++)
                recv_ok += wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)(done + i);
            done += n;
        }
    });
    std::thread tx([&] {
        int posted = 0, done = 0;
        double end = now_s() + 10;
        while (done < kMsgs && now_s() < end) {
            while (posted < kMsgs && posted - done < 16) {
                if (post_send(p.a, (uint64_t)posted, p.bufa.data(), 8, p.mra->lkey) != 0)
                    return;
                posted++;
            }
            ibv_wc wc[16];
            int n = ibv_poll_cq(p.cqa, 16, wc);
            if (n < 0)
                return;
            for (int i = 0; i < n; i++)
                send_ok += wc[i].status == IBV_WC_SUCCESS;
            done += n;
        }
    });
    tx.join();
    rx.join();
    EXPECT_EQ(send_ok, kMsgs);
    EXPECT_EQ(recv_ok, kMsgs);
}

TEST(EmuVerbs, StatsFile)
{
    // The file is made by the first run, which names it to the run with the
    // knob (a child process: WITH_KNOBS) and removes it after.
    const char *given = getenv("WEFT_EMU_VERBS_STATS");
    const std::string prefix = "/tmp/wemu-stats-";
    std::string path = given && std::string(given).rfind(prefix, 0) == 0 ? given : "";
    if (path.empty()) {
        char tmpl[] = "/tmp/wemu-stats-XXXXXX";
        int fd = mkstemp(tmpl);
        ASSERT_GE(fd, 0);
        close(fd);
        path = tmpl;
    }
    if (knobs_elsewhere({{"WEFT_EMU_VERBS_STATS", path.c_str()}})) {
        unlink(path.c_str());
        return;
    }
    {
        Pair p;
        ASSERT_TRUE(p.ok());
        ASSERT_TRUE(p.connect());
        ASSERT_EQ(post_write(p.a, 1, p.bufa.data(), 100, p.mra->lkey, p.ab.addr, p.mrb->rkey), 0);
        ibv_wc wc{};
        ASSERT_EQ(poll_n(p.cqa, &wc, 1), 1);
    }
    FILE *f = fopen(path.c_str(), "r");
    ASSERT_NE(f, nullptr);
    char line[1024] = {};
    ASSERT_NE(fgets(line, sizeof line, f), nullptr);
    fclose(f);
    unlink(path.c_str());
    EXPECT_NE(strstr(line, " write=1 "), nullptr) << line;
    EXPECT_NE(strstr(line, " bytes_out=100 "), nullptr) << line;
}

TEST(EmuVerbs, LargeTransferChunkedByCma)
{
    WITH_KNOBS({});
    Pair p;
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(p.connect());
    for (size_t i = 0; i < Pair::kBuf; i++)
        p.bufa[i] = (uint8_t)(i * 13);
    ASSERT_EQ(post_write(p.a, 1, p.bufa.data(), Pair::kBuf, p.mra->lkey, p.ab.addr, p.mrb->rkey), 0);
    ibv_wc wc{};
    ASSERT_EQ(poll_n(p.cqa, &wc, 1), 1);
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(memcmp(p.bufa.data(), p.bufb.data(), Pair::kBuf), 0);
}

// ---- dma-buf MRs ----------------------------------------------------------------
// An emulated dma-buf as libweft_emu_cuda.so makes one (cuMemGetHandleForAddressRange):
// a memfd descriptor whose file position encodes the range, tag | first page |
// pages (EMU_DMABUF_* in both emulators). Lets these tests run without it.
int fake_dmabuf(int memfd, uint64_t first_page, uint64_t pages)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", memfd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd >= 0)
        lseek(fd, (off_t)((0x2Dull << 56) | (first_page << 28) | pages), SEEK_SET);
    return fd;
}

TEST(EmuVerbs, RegMrOfInaccessibleMemoryFails)
{
    // What a NIC without a peer-memory module does with a GPU pointer.
    WITH_KNOBS({});
    Pair p;
    ASSERT_TRUE(p.ok());
    void *none = mmap(nullptr, 8192, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(none, MAP_FAILED);
    errno = 0;
    EXPECT_EQ(api().reg_mr(p.pd, none, 8192, IBV_ACCESS_LOCAL_WRITE), nullptr);
    EXPECT_EQ(errno, EFAULT);
    munmap(none, 8192);
}

TEST(EmuVerbs, DmaBufMrLoopback)
{
    WITH_KNOBS({});
    const size_t kFile = 16 * 4096;
    int memfd = memfd_create("wemu-test-dmabuf", MFD_CLOEXEC);
    ASSERT_GE(memfd, 0);
    ASSERT_EQ(ftruncate(memfd, (off_t)kFile), 0);
    uint8_t *file = (uint8_t *)mmap(nullptr, kFile, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    ASSERT_NE(file, MAP_FAILED);
    for (size_t i = 0; i < kFile; i++)
        file[i] = (uint8_t)(i * 5 + 1);
    // the dma-buf: pages 2..9 of the file; its offset 0 is file offset 8192
    int fd = fake_dmabuf(memfd, 2, 8);
    ASSERT_GE(fd, 0);
    const uint64_t iova = 0x7e5500001000ull; // an address nothing maps here
    const int full = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    {
        Pair p;
        ASSERT_TRUE(p.ok());
        ASSERT_TRUE(p.connect());
        // refusals: bad descriptor, not a dma-buf, past its end, iova and
        // offset not agreeing within a page, zero length, access flags
        errno = 0;
        EXPECT_EQ(api().reg_dmabuf_mr(p.pd, 0, 4096, iova, -1, full), nullptr);
        EXPECT_EQ(errno, EBADF);
        errno = 0;
        EXPECT_EQ(api().reg_dmabuf_mr(p.pd, 0, 4096, iova, memfd, full), nullptr);
        EXPECT_EQ(errno, EINVAL);
        errno = 0;
        EXPECT_EQ(api().reg_dmabuf_mr(p.pd, 4096, 8 * 4096, iova, fd, full), nullptr);
        EXPECT_EQ(errno, EINVAL);
        errno = 0;
        EXPECT_EQ(api().reg_dmabuf_mr(p.pd, 0, 4096, iova + 8, fd, full), nullptr);
        EXPECT_EQ(errno, EINVAL);
        EXPECT_EQ(api().reg_dmabuf_mr(p.pd, 0, 0, iova, fd, full), nullptr);
        EXPECT_EQ(api().reg_dmabuf_mr(p.pd, 0, 4096, iova, fd, IBV_ACCESS_REMOTE_WRITE), nullptr);
        // [iova, iova + 6 pages) = file [12288, 36864): offset 4096 into the dma-buf
        ibv_mr *dm = api().reg_dmabuf_mr(p.pd, 4096, 6 * 4096, iova, fd, full);
        ASSERT_NE(dm, nullptr) << strerror(errno);
        EXPECT_EQ((uint64_t)(uintptr_t)dm->addr, iova);
        EXPECT_EQ(dm->length, 6u * 4096);
        close(fd); // the MR keeps the memory
        const size_t base = 12288;
        // RDMA WRITE from host memory into it
        for (int i = 0; i < 5000; i++)
            p.bufa[i] = (uint8_t)(i ^ 0x33);
        ASSERT_EQ(post_write(p.a, 1, p.bufa.data(), 5000, p.mra->lkey, iova + 100, dm->rkey), 0);
        // RDMA READ out of it
        ASSERT_EQ(post_write(p.a, 2, p.bufa.data() + 65536, 3000, p.mra->lkey, iova + 9000, dm->rkey,
                             IBV_SEND_SIGNALED, IBV_WR_RDMA_READ),
                  0);
        ibv_wc wc[2];
        ASSERT_EQ(poll_n(p.cqa, wc, 2), 2);
        EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
        EXPECT_EQ(wc[1].status, IBV_WC_SUCCESS);
        for (int i = 0; i < 5000; i++)
            ASSERT_EQ(file[base + 100 + i], (uint8_t)(i ^ 0x33)) << i;
        EXPECT_EQ(file[base + 99], (uint8_t)((base + 99) * 5 + 1));
        for (int i = 0; i < 3000; i++)
            ASSERT_EQ(p.bufa[65536 + i], (uint8_t)((base + 9000 + i) * 5 + 1)) << i;
        // a dma-buf MR as the local side: WRITE from it, SEND into a receive in it
        ASSERT_EQ(post_write(p.a, 3, (void *)(uintptr_t)(iova + 100), 64, dm->lkey, p.ab.addr + 512, p.mrb->rkey), 0);
        ASSERT_EQ(post_recv(p.b, 40, (void *)(uintptr_t)(iova + 20000), 128, dm->lkey), 0);
        ASSERT_EQ(post_send(p.a, 4, p.bufa.data() + 100, 128, p.mra->lkey), 0);
        ASSERT_EQ(poll_n(p.cqa, wc, 2), 2);
        EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
        EXPECT_EQ(wc[1].status, IBV_WC_SUCCESS);
        ASSERT_EQ(poll_n(p.rcqb, wc, 1), 1);
        EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
        EXPECT_EQ(memcmp(p.bufb.data() + 512, file + base + 100, 64), 0);
        EXPECT_EQ(memcmp(file + base + 20000, p.bufa.data() + 100, 128), 0);
        // out of its bounds: remote access error
        ASSERT_EQ(post_write(p.a, 5, p.bufa.data(), 16, p.mra->lkey, iova + 6 * 4096 - 8, dm->rkey), 0);
        ASSERT_EQ(poll_n(p.cqa, wc, 1), 1);
        EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
        EXPECT_EQ(api().dereg_mr(dm), 0);
    }
    munmap(file, kFile);
    close(memfd);
}

#ifdef WEFT_EMU_VERBS_TEST_CUDA
unsigned char dev_pattern(size_t i) { return (unsigned char)(i * 29 + 7); }

// GPUDirect RDMA end to end: the child owns device memory (emulated CUDA,
// not host-accessible) registered through a dma-buf; the parent writes into
// it and reads from it with RDMA from host memory.
TEST(EmuVerbs, DmaBufMrOverDeviceMemoryAcrossProcesses)
{
    WITH_KNOBS({{"WEFT_EMU_CUDA_GDR", "1"}});
    const size_t kDev = 1 << 20, kOff = 65536, kLen = 256 * 1024;
    Child child([&](int rfd, int wfd) -> int {
        void *d = nullptr;
        CCHECK(cudaMalloc(&d, kDev) == cudaSuccess);
        std::vector<unsigned char> h(kDev);
        for (size_t i = 0; i < kDev; i++)
            h[i] = dev_pattern(i);
        CCHECK(cudaMemcpy(d, h.data(), kDev, cudaMemcpyHostToDevice) == cudaSuccess);
        CCHECK(cudaDeviceSynchronize() == cudaSuccess); // a pageable H2D copy lands late
        CUdeviceptr range = (CUdeviceptr)d + kOff;
        int fd = -1;
        CCHECK(cuMemGetHandleForAddressRange(&fd, range, kLen, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) ==
               CUDA_SUCCESS);
        ibv_context *ctx = open_dev();
        CCHECK(ctx);
        ibv_pd *pd = api().alloc_pd(ctx);
        ibv_cq *cq = api().create_cq(ctx, 64, nullptr, nullptr, 0);
        ibv_qp *qp = make_qp(pd, cq, cq);
        CCHECK(pd && cq && qp);
        const int full = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        // plain ibv_reg_mr of device memory: no peer-memory module, EFAULT
        errno = 0;
        CCHECK(api().reg_mr(pd, d, 4096, full) == nullptr && errno == EFAULT);
        // the real recipe: offset 0, iova = the exported range's start
        ibv_mr *mr = api().reg_dmabuf_mr(pd, 0, kLen, (uint64_t)range, fd, full);
        CCHECK(mr);
        close(fd);
        CCHECK(to_init(qp, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ) == 0);
        Addr me = local_addr(ctx, qp, 77, -1, (void *)(uintptr_t)range, mr), peer{};
        CCHECK(write_all(wfd, &me, sizeof me) && read_all(rfd, &peer, sizeof peer));
        CCHECK(to_rtr(qp, peer, ConnOpts()) == 0 && to_rts(qp, me.psn, ConnOpts()) == 0);
        // local side in device memory: WRITE the range's first 4 KiB to the parent
        CCHECK(post_write(qp, 1, (void *)(uintptr_t)range, 4096, mr->lkey, peer.addr, peer.rkey) == 0);
        ibv_wc wc{};
        CCHECK(poll_n(cq, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS);
        char c = 'w';
        CCHECK(write_all(wfd, &c, 1));
        CCHECK(read_all(rfd, &c, 1) && c == 'd'); // the parent's WRITE, READ, bad WRITE are done
        CCHECK(cudaMemcpy(h.data(), d, kDev, cudaMemcpyDeviceToHost) == cudaSuccess);
        for (size_t i = 0; i < kDev; i++) {
            size_t r = i - kOff;
            unsigned char want = (i >= kOff + 100 && r < 100 + 5000) ? (unsigned char)((r - 100) ^ 0x6b) : dev_pattern(i);
            CCHECK(h[i] == want);
        }
        CCHECK(api().destroy_qp(qp) == 0 && api().dereg_mr(mr) == 0 && api().destroy_cq(cq) == 0 &&
               api().dealloc_pd(pd) == 0 && api().close_device(ctx) == 0);
        CCHECK(cudaFree(d) == cudaSuccess);
        return 0;
    });
    ASSERT_GT(child.pid, 0);
    std::vector<uint8_t> buf(1 << 20, 0);
    ibv_context *ctx = open_dev();
    ASSERT_NE(ctx, nullptr);
    ibv_pd *pd = api().alloc_pd(ctx);
    ibv_cq *cq = api().create_cq(ctx, 64, nullptr, nullptr, 0);
    ibv_qp *qp = make_qp(pd, cq, cq);
    ibv_mr *mr = api().reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ASSERT_TRUE(pd && cq && qp && mr);
    Addr peer{};
    ASSERT_TRUE(read_all(child.rfd, &peer, sizeof peer));
    Addr me = local_addr(ctx, qp, 88, -1, buf.data(), mr);
    ASSERT_EQ(to_init(qp, IBV_ACCESS_REMOTE_WRITE), 0);
    ASSERT_EQ(to_rtr(qp, peer, ConnOpts()), 0);
    ASSERT_EQ(to_rts(qp, me.psn, ConnOpts()), 0);
    ASSERT_TRUE(write_all(child.wfd, &me, sizeof me));
    char c = 0;
    ASSERT_TRUE(read_all(child.rfd, &c, 1));
    for (size_t i = 0; i < 4096; i++)
        ASSERT_EQ(buf[i], dev_pattern(kOff + i)) << "the child's WRITE from device memory, byte " << i;
    // WRITE into the child's device memory, READ from it
    for (size_t i = 0; i < 5000; i++)
        buf[8192 + i] = (uint8_t)(i ^ 0x6b);
    ASSERT_EQ(post_write(qp, 1, buf.data() + 8192, 5000, mr->lkey, peer.addr + 100, peer.rkey), 0);
    ASSERT_EQ(post_write(qp, 2, buf.data() + 65536, 100000, mr->lkey, peer.addr + 20000, peer.rkey,
                         IBV_SEND_SIGNALED, IBV_WR_RDMA_READ),
              0);
    ibv_wc wc[2];
    ASSERT_EQ(poll_n(cq, wc, 2), 2);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS) << api().wc_status_str(wc[0].status);
    EXPECT_EQ(wc[1].status, IBV_WC_SUCCESS) << api().wc_status_str(wc[1].status);
    for (size_t i = 0; i < 100000; i++)
        ASSERT_EQ(buf[65536 + i], dev_pattern(kOff + 20000 + i)) << i;
    // past the end of the dma-buf MR
    ASSERT_EQ(post_write(qp, 3, buf.data(), 16, mr->lkey, peer.addr + kLen - 8, peer.rkey), 0);
    ASSERT_EQ(poll_n(cq, wc, 1), 1);
    EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
    c = 'd';
    ASSERT_TRUE(write_all(child.wfd, &c, 1));
    EXPECT_EQ(child.wait(), 0);
    EXPECT_EQ(api().destroy_qp(qp), 0);
    EXPECT_EQ(api().dereg_mr(mr), 0);
    EXPECT_EQ(api().destroy_cq(cq), 0);
    EXPECT_EQ(api().dealloc_pd(pd), 0);
    EXPECT_EQ(api().close_device(ctx), 0);
}

// WEFT_EMU_VERBS_PEERMEM=1: ibv_reg_mr takes device pointers (nvidia-peermem);
// and an interior dma-buf range with a non-zero offset.
TEST(EmuVerbs, PeermemKnobAndDmaBufOffset)
{
    WITH_KNOBS({{"WEFT_EMU_VERBS_PEERMEM", "1"}, {"WEFT_EMU_CUDA_GDR", "1"}});
    Child child([&](int, int) -> int {
        const size_t kDev = 64 * 1024;
        void *d = nullptr;
        CCHECK(cudaMalloc(&d, kDev) == cudaSuccess);
        std::vector<unsigned char> h(kDev);
        for (size_t i = 0; i < kDev; i++)
            h[i] = dev_pattern(i);
        CCHECK(cudaMemcpy(d, h.data(), kDev, cudaMemcpyHostToDevice) == cudaSuccess);
        CCHECK(cudaDeviceSynchronize() == cudaSuccess); // a pageable H2D copy lands late
        char *dc = (char *)d;
        const int full = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        {
            Pair p;
            CCHECK(p.ok() && p.connect());
            // an unaligned device range, as nvidia-peermem accepts
            ibv_mr *pm = api().reg_mr(p.pd, dc + 100, 5000, full);
            CCHECK(pm && pm->addr == dc + 100 && pm->length == 5000);
            // beyond the allocation's block (2 MiB: the pages a GPU pins): EFAULT
            errno = 0;
            CCHECK(api().reg_mr(p.pd, dc + 100, 2u << 20, full) == nullptr && errno == EFAULT);
            // dma-buf of [d+4096, d+36864), registered from dma-buf offset 4096 at iova d+8192
            int fd = -1;
            CCHECK(cuMemGetHandleForAddressRange(&fd, (CUdeviceptr)dc + 4096, 32768,
                                                 CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) == CUDA_SUCCESS);
            ibv_mr *dm = api().reg_dmabuf_mr(p.pd, 4096, 16384, (uint64_t)(uintptr_t)(dc + 8192), fd, full);
            CCHECK(dm);
            close(fd);
            for (int i = 0; i < 1000; i++)
                p.bufa[i] = (uint8_t)(i + 17);
            CCHECK(post_write(p.a, 1, p.bufa.data(), 1000, p.mra->lkey, (uint64_t)(uintptr_t)(dc + 200), pm->rkey) ==
                   0);
            CCHECK(post_write(p.a, 2, p.bufa.data() + 4096, 3000, p.mra->lkey, (uint64_t)(uintptr_t)(dc + 8192 + 10),
                              dm->rkey, IBV_SEND_SIGNALED, IBV_WR_RDMA_READ) == 0);
            CCHECK(post_recv(p.b, 9, dc + 8192 + 5000, 100, dm->lkey) == 0);
            CCHECK(post_send(p.a, 3, p.bufa.data() + 500, 100, p.mra->lkey) == 0);
            CCHECK(post_write(p.a, 4, p.bufa.data(), 16, p.mra->lkey, (uint64_t)(uintptr_t)(dc + 8192 + 16384 - 8),
                              dm->rkey) == 0);
            ibv_wc wc[4];
            CCHECK(poll_n(p.cqa, wc, 4) == 4);
            CCHECK(wc[0].status == IBV_WC_SUCCESS && wc[1].status == IBV_WC_SUCCESS && wc[2].status == IBV_WC_SUCCESS);
            CCHECK(wc[3].status == IBV_WC_REM_ACCESS_ERR);
            for (int i = 0; i < 3000; i++)
                CCHECK(p.bufa[4096 + i] == dev_pattern(8192 + 10 + (size_t)i));
            CCHECK(cudaMemcpy(h.data(), d, kDev, cudaMemcpyDeviceToHost) == cudaSuccess);
            for (int i = 0; i < 1000; i++)
                CCHECK(h[200 + i] == (uint8_t)(i + 17));
            CCHECK(h[199] == dev_pattern(199) && h[1200] == dev_pattern(1200));
            for (int i = 0; i < 100; i++)
                CCHECK(h[8192 + 5000 + i] == (uint8_t)(500 + i + 17));
            CCHECK(api().dereg_mr(pm) == 0 && api().dereg_mr(dm) == 0);
        }
        CCHECK(cudaFree(d) == cudaSuccess);
        return 0;
    });
    ASSERT_GT(child.pid, 0);
    EXPECT_EQ(child.wait(), 0);
}
#endif // WEFT_EMU_VERBS_TEST_CUDA

} // namespace
