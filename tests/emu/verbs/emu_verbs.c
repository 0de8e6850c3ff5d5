/*
 * Emulated verbs device: libweft_emu_verbs.so. See README.md in this folder.
 *
 * One POSIX shm segment per process (/wemu-verbs-<pid>) holds the state a
 * peer must reach: QPs (connection attributes, receive queues), MRs and CQs.
 * Send work requests live in process memory and execute when the owning
 * process polls a CQ of the context; data moves with process_vm_readv/writev.
 *
 * dma-buf MRs (ibv_reg_dmabuf_mr, and ibv_reg_mr of emulated device memory
 * with WEFT_EMU_VERBS_PEERMEM=1): the owner maps the dma-buf into its own
 * memory (the "alias") and records the alias address in the MR table; every
 * access to [iova, iova+length) -- local SGEs, and peers' CMA into the
 * owner -- goes to the alias instead of the iova, which the owner's host
 * code cannot touch (device memory of libweft_emu_cuda.so is PROT_NONE).
 *
 * Locks, always taken in this order and never two segment locks at once:
 *   emu_context.lock  ->  g.lock (briefly)  ->  one segment's lock.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>
#include <dlfcn.h>

#include <infiniband/verbs.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- limits of the emulated HCA ----------------------------------------- */
#define EMU_MAX_DEVS 3          /* IB LIDs: 0x4000 per device, below 0xC000 */
#define EMU_MAX_QPS 1024        /* per process; qp index = slot + 2 */
#define EMU_MAX_MRS 16384
#define EMU_MAX_CQS 1024
#define EMU_MAX_PDS 1024
#define EMU_MAX_SGE 16
#define EMU_MAX_RD_ATOM 16
#define EMU_HEAP_SIZE (256ull << 20) /* sparse: only pages touched use memory */
#define EMU_HEAP_BLOCKS 4096
#define EMU_GID_TBL_LEN_ROCE 8  /* 4 populated, 4 empty */
#define EMU_RETRY_CAP_NS 2000000000ull /* transport and RNR retry give up after 2 s at most */
#define EMU_MAX_RSEGS 512

#define EMU_MAGIC 0x57454d5556425253ull
#define EMU_VERSION 2

/* The emulated dma-buf of libweft_emu_cuda.so (cuMemGetHandleForAddressRange):
 * a descriptor of a memfd whose file position encodes the range it stands for,
 *   tag (bits 62..56) | first page in the file (55..28) | pages (27..0).
 * Keep in step with EMU_DMABUF_* in tests/emu/cuda/emu_cuda.c. */
#define EMU_DMABUF_TAG 0x2Dull
#define EMU_DMABUF_FIELD 28
#define EMU_PAGE 4096ull

/* garbage written into error completions (only wr_id, status, qp_num and
 * vendor_err are valid there, as on hardware) */
#define EMU_GARBAGE_LEN 0xBADC0DEu
#define EMU_GARBAGE_IMM 0xDEADBEEFu

/* ---- shared-memory layout ------------------------------------------------ */
struct shm_hdr {
    uint64_t magic;
    uint32_t version;
    int32_t pid;
    uint64_t instance;
    uint64_t size;
    pthread_mutex_t lock; /* process-shared, robust */
    int32_t closed;       /* __atomic: set at the last close / exit */
    int32_t dropped;      /* __atomic: DROP_AFTER fired: gone from the fabric */
};

struct shm_qp {
    uint32_t in_use, gen, qpn, state;
    uint32_t dev, pd_id, access, path_mtu;
    uint32_t dest_qpn, rq_psn, sq_psn, max_dest_rd;
    uint32_t max_rd, min_rnr_timer, send_cq, recv_cq;
    uint32_t roce, sgid_type, own_lid, dlid;
    uint8_t sgid[16], dgid[16];
    uint64_t rq_off;
    uint32_t rq_cap, rq_nsge, rq_head, rq_tail;
};

struct shm_rwr {
    uint64_t wr_id;
    uint32_t num_sge, pad;
    struct ibv_sge sg[];
};

struct shm_mr {
    uint32_t in_use, key, pd_id, access;
    uint64_t addr, length;
    uint64_t alias; /* dma-buf MR: where [addr, addr+length) is in the owner's
                       memory (its mapping of the dma-buf); 0: at addr itself */
};

/* where the owner of m keeps the byte at addr (inside m) */
static inline void *mr_where(const struct shm_mr *m, uint64_t addr)
{
    return (void *)(uintptr_t)(m->alias ? m->alias + (addr - m->addr) : addr);
}

struct shm_cq {
    uint32_t in_use, gen, cap, broken;
    uint32_t head, tail; /* free-running */
    uint64_t ring_off;
};

struct emu_cqe {
    struct ibv_wc wc;
    uint32_t is_send, qp_slot, qp_gen, pad;
    uint64_t sq_seq;
};

#define OFF_QPS  ((sizeof(struct shm_hdr) + 63) & ~(size_t)63)
#define OFF_MRS  (OFF_QPS + sizeof(struct shm_qp) * EMU_MAX_QPS)
#define OFF_CQS  (OFF_MRS + sizeof(struct shm_mr) * EMU_MAX_MRS)
#define OFF_HEAP ((OFF_CQS + sizeof(struct shm_cq) * EMU_MAX_CQS + 4095) & ~(size_t)4095)
#define SEG_SIZE (OFF_HEAP + EMU_HEAP_SIZE)

struct seg {
    pid_t pid;
    uint64_t instance;
    struct shm_hdr *hdr;
};

static inline struct shm_qp *seg_qp(const struct seg *s, uint32_t i)
{
    return (struct shm_qp *)((char *)s->hdr + OFF_QPS) + i;
}
static inline struct shm_mr *seg_mr(const struct seg *s, uint32_t i)
{
    return (struct shm_mr *)((char *)s->hdr + OFF_MRS) + i;
}
static inline struct shm_cq *seg_cq(const struct seg *s, uint32_t i)
{
    return (struct shm_cq *)((char *)s->hdr + OFF_CQS) + i;
}
static inline void *seg_heap(const struct seg *s, uint64_t off)
{
    return (char *)s->hdr + OFF_HEAP + off;
}

static void seg_lock(const struct seg *s)
{
    int r = pthread_mutex_lock(&s->hdr->lock);
    if (r == EOWNERDEAD)
        pthread_mutex_consistent(&s->hdr->lock);
}
static void seg_unlock(const struct seg *s) { pthread_mutex_unlock(&s->hdr->lock); }

/* ---- process-local objects ------------------------------------------------ */
struct emu_device {
    struct ibv_device dev;
    int index;
    int port_down;
};

struct emu_qp;

struct emu_context {
    struct ibv_context ctx;
    struct emu_device *edev;
    pthread_mutex_t lock;
    struct emu_qp *qps;
};

struct emu_pd {
    struct ibv_pd pd;
    uint32_t id;
    int nref;
};

struct emu_cq {
    struct ibv_cq cq;
    uint32_t slot;
    int nref;
};

struct emu_mr {
    struct ibv_mr mr;
    uint32_t slot;
    struct emu_pd *epd;
    void *map;      /* dma-buf MR: the mapping behind the alias (munmap at dereg) */
    size_t map_len;
};

struct swr {
    uint64_t wr_id;
    int opcode;
    int signaled;
    int inl;
    int fault;
    int drop;
    uint32_t num_sge;
    uint32_t rkey;
    uint32_t imm;
    uint64_t len;
    uint64_t raddr;
    uint64_t t_first; /* first attempt found the peer unreachable (ns) */
    uint64_t t_rnr;   /* first RNR (ns) */
    int rnr_counted;
    struct ibv_sge sg[EMU_MAX_SGE];
};

struct emu_qp {
    struct ibv_qp qp;
    struct emu_qp *next;
    struct emu_context *ec;
    uint32_t slot, gen;
    struct emu_pd *epd;
    struct emu_cq *scq, *rcq;
    struct swr *sq;
    uint8_t *inl_buf;
    uint32_t sq_cap, max_inline, max_send_sge, max_recv_sge, max_recv_wr;
    int sig_all;
    uint64_t sq_head, sq_exec, sq_tail; /* retired / executed / posted */
    uint8_t timeout, retry_cnt, rnr_retry;
};

struct rseg {
    struct seg s;
    int valid;
};

struct heap_block {
    uint64_t off, len;
};

struct emu_stats {
    uint64_t send, send_imm, write, write_imm, read, recv_posted;
    uint64_t bytes_out, bytes_in;
    uint64_t rnr_waits, retry_waits, errors, flushes;
};

static struct {
    pthread_mutex_t lock;
    pid_t pid; /* owner of this state (fork detection) */
    /* configuration */
    int cfg_loaded;
    int roce;
    uint64_t max_msg;
    int max_qp_wr, max_inline, max_cqe, mtu_enum;
    uint64_t fail_wr, drop_after;
    int fail_status;
    int faults_here;
    int peermem;
    char stats_path[512];
    int ndev;
    struct emu_device devs[EMU_MAX_DEVS];
    /* state while contexts are open */
    int nctx;
    struct seg self;
    struct heap_block blocks[EMU_HEAP_BLOCKS];
    int nblocks;
    struct emu_qp *qp_by_slot[EMU_MAX_QPS];
    uint8_t pd_used[EMU_MAX_PDS];
    uint32_t mr_gen[EMU_MAX_MRS];
    uint32_t next_mr;
    struct rseg rsegs[EMU_MAX_RSEGS];
    int nrsegs;
    uint64_t nsend_posted;
    int dropped;
    struct emu_stats st;
    int swept;
} g = { .lock = PTHREAD_MUTEX_INITIALIZER };

#define STAT_ADD(f, v) __atomic_fetch_add(&g.st.f, (uint64_t)(v), __ATOMIC_RELAXED)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void seg_name(char *buf, size_t len, pid_t pid)
{
    snprintf(buf, len, "/wemu-verbs-%d", (int)pid);
}

/* ---- configuration ------------------------------------------------------ */
static uint64_t env_u64(const char *name, uint64_t def)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return def;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 0);
    if (errno || end == v)
        return def;
    switch (*end) {
    case 'k': case 'K': x <<= 10; break;
    case 'm': case 'M': x <<= 20; break;
    case 'g': case 'G': x <<= 30; break;
    default: break;
    }
    return x;
}

static int mtu_to_enum(uint64_t bytes)
{
    switch (bytes) {
    case 256: return IBV_MTU_256;
    case 512: return IBV_MTU_512;
    case 1024: return IBV_MTU_1024;
    case 2048: return IBV_MTU_2048;
    default: return IBV_MTU_4096;
    }
}

static int name_in_list(const char *list, const char *name)
{
    if (!list)
        return 0;
    size_t n = strlen(name);
    const char *p = list;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && !strncmp(p, name, n))
            return 1;
        if (!e)
            break;
        p = e + 1;
    }
    return 0;
}

/* g.lock held; only while no context is open */
static void load_config(void)
{
    const char *link = getenv("WEFT_EMU_VERBS_LINK");
    g.roce = link && !strcmp(link, "roce");
    g.max_msg = env_u64("WEFT_EMU_VERBS_MAX_MSG", 1ull << 30);
    if (g.max_msg == 0 || g.max_msg > 0x80000000ull)
        g.max_msg = 0x80000000ull; /* port attr max_msg_sz is 32 bits; 2 GiB as IB */
    g.max_qp_wr = (int)env_u64("WEFT_EMU_VERBS_MAX_QP_WR", 16384);
    if (g.max_qp_wr < 1 || g.max_qp_wr > 65536)
        g.max_qp_wr = 16384;
    g.max_inline = (int)env_u64("WEFT_EMU_VERBS_MAX_INLINE", 220);
    if (g.max_inline < 0 || g.max_inline > 4096)
        g.max_inline = 220;
    g.max_cqe = (int)env_u64("WEFT_EMU_VERBS_MAX_CQE", 65536);
    if (g.max_cqe < 1 || g.max_cqe > (1 << 22))
        g.max_cqe = 65536;
    g.mtu_enum = mtu_to_enum(env_u64("WEFT_EMU_VERBS_MTU", 4096));
    g.fail_wr = env_u64("WEFT_EMU_VERBS_FAIL_WR", 0);
    g.fail_status = (int)env_u64("WEFT_EMU_VERBS_FAIL_STATUS", IBV_WC_RETRY_EXC_ERR);
    if (g.fail_status <= 0 || g.fail_status > IBV_WC_TM_RNDV_INCOMPLETE)
        g.fail_status = IBV_WC_RETRY_EXC_ERR;
    g.drop_after = env_u64("WEFT_EMU_VERBS_DROP_AFTER", 0);
    g.peermem = env_u64("WEFT_EMU_VERBS_PEERMEM", 0) != 0;
    const char *fr = getenv("WEFT_EMU_VERBS_FAULT_RANK");
    g.faults_here = 1;
    if (fr && *fr) {
        const char *r = getenv("OMPI_COMM_WORLD_RANK");
        if (!r || !*r)
            r = getenv("PMIX_RANK");
        g.faults_here = r && atoi(r) == atoi(fr);
    }
    const char *sp = getenv("WEFT_EMU_VERBS_STATS");
    snprintf(g.stats_path, sizeof g.stats_path, "%s", sp ? sp : "");

    const char *devs = getenv("WEFT_EMU_VERBS_DEVICES");
    if (!devs)
        devs = "emu_0";
    const char *down = getenv("WEFT_EMU_VERBS_PORT_DOWN");
    g.ndev = 0;
    const char *p = devs;
    while (*p && g.ndev < EMU_MAX_DEVS) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l > 0 && l < IBV_SYSFS_NAME_MAX) {
            struct emu_device *d = &g.devs[g.ndev];
            memset(d, 0, sizeof *d);
            memcpy(d->dev.name, p, l);
            d->dev.name[l] = 0;
            d->dev.node_type = IBV_NODE_CA;
            d->dev.transport_type = IBV_TRANSPORT_IB;
            snprintf(d->dev.dev_name, sizeof d->dev.dev_name, "uverbs%d", g.ndev);
            snprintf(d->dev.dev_path, sizeof d->dev.dev_path,
                     "/sys/class/infiniband_verbs/uverbs%d", g.ndev);
            char nm[IBV_SYSFS_NAME_MAX];
            memcpy(nm, p, l);
            nm[l] = 0;
            snprintf(d->dev.ibdev_path, sizeof d->dev.ibdev_path, "/sys/class/infiniband/%s", nm);
            d->index = g.ndev;
            d->port_down = name_in_list(down, d->dev.name);
            g.ndev++;
        }
        if (!e)
            break;
        p = e + 1;
    }
    g.cfg_loaded = 1;
}

/* g.lock held */
static void check_fork(void)
{
    pid_t me = getpid();
    if (g.pid == me)
        return;
    /* A forked child inherits the parent's state: forget it (the parent's
     * segment and contexts are the parent's; never unlink them here). */
    if (g.pid != 0) {
        if (g.self.hdr)
            munmap(g.self.hdr, SEG_SIZE);
        for (int i = 0; i < g.nrsegs; i++)
            if (g.rsegs[i].valid)
                munmap(g.rsegs[i].s.hdr, SEG_SIZE);
    }
    g.self.hdr = NULL;
    g.nrsegs = 0;
    g.nctx = 0;
    g.nblocks = 0;
    memset(g.qp_by_slot, 0, sizeof g.qp_by_slot);
    memset(g.pd_used, 0, sizeof g.pd_used);
    g.cfg_loaded = 0;
    g.swept = 0;
    g.pid = me;
}

/* ---- addresses ------------------------------------------------------------ */
static uint16_t make_lid(pid_t pid, int dev) { return (uint16_t)(1 + ((uint32_t)pid & 0x3FFF) + (uint32_t)dev * 0x4000); }
static uint32_t make_qpn(pid_t pid, uint32_t slot) { return (((uint32_t)pid >> 14) << 16) | (slot + 2); }

static void make_gid(pid_t pid, int dev, int index, uint8_t gid[16])
{
    memset(gid, 0, 16);
    uint32_t p = (uint32_t)pid;
    uint8_t a = (uint8_t)(((unsigned)dev << 6) | ((p >> 16) & 0x3F));
    if (!g.roce) { /* IB: fe80::GUID */
        gid[0] = 0xfe; gid[1] = 0x80;
        gid[8] = 0x02; gid[9] = 0xc9; gid[10] = 0x03; gid[11] = 0x00;
        gid[12] = 0x0a; gid[13] = a; gid[14] = (uint8_t)(p >> 8); gid[15] = (uint8_t)p;
        return;
    }
    if (index == 0 || index == 1) { /* link-local fe80::2c9:3ff:0a..:.. */
        gid[0] = 0xfe; gid[1] = 0x80;
        gid[8] = 0x02; gid[9] = 0xc9; gid[10] = 0x03; gid[11] = 0xff;
    } else { /* IPv4-mapped ::ffff:10.a.b.c */
        gid[10] = 0xff; gid[11] = 0xff;
    }
    gid[12] = 0x0a; gid[13] = a; gid[14] = (uint8_t)(p >> 8); gid[15] = (uint8_t)p;
}

static int gid_populated(int index) { return g.roce ? (index >= 0 && index < 4) : index == 0; }
static uint32_t gid_type_of(int index)
{
    if (!g.roce)
        return IBV_GID_TYPE_IB;
    return (index & 1) ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1;
}
static int gid_tbl_len(void) { return g.roce ? EMU_GID_TBL_LEN_ROCE : 1; }

/* owner of a GID made by make_gid: pid and device, or -1 */
static int gid_owner(const uint8_t gid[16], pid_t *pid, int *dev)
{
    static const uint8_t ll[12] = { 0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0xc9, 0x03, 0xff };
    static const uint8_t v4[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
    if (memcmp(gid, ll, 12) && memcmp(gid, v4, 12))
        return -1;
    if (gid[12] != 0x0a)
        return -1;
    *dev = gid[13] >> 6;
    *pid = (pid_t)(((uint32_t)(gid[13] & 0x3F) << 16) | ((uint32_t)gid[14] << 8) | gid[15]);
    return 0;
}

static uint32_t mtu_bytes(uint32_t e) { return e >= 1 && e <= 5 ? 128u << e : 4096; }

/* ---- segments --------------------------------------------------------------- */
static void sweep_dead_segments(void)
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        int pid;
        char tail;
        if (sscanf(de->d_name, "wemu-verbs-%d%c", &pid, &tail) != 1 || pid <= 0)
            continue;
        if (kill(pid, 0) == -1 && errno == ESRCH) {
            char name[64];
            seg_name(name, sizeof name, pid);
            shm_unlink(name);
        }
    }
    closedir(d);
}

/* g.lock held */
static int self_seg_create(void)
{
    if (!g.swept) {
        sweep_dead_segments();
        g.swept = 1;
    }
    char name[64];
    seg_name(name, sizeof name, g.pid);
    shm_unlink(name); /* a leftover of a dead process that had our pid */
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return -1;
    if (ftruncate(fd, (off_t)SEG_SIZE) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(name);
        errno = e;
        return -1;
    }
    void *m = mmap(NULL, SEG_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) {
        shm_unlink(name);
        errno = e;
        return -1;
    }
    struct shm_hdr *h = m;
    h->version = EMU_VERSION;
    h->pid = g.pid;
    h->instance = now_ns() ^ ((uint64_t)g.pid << 40);
    h->size = SEG_SIZE;
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&h->lock, &a);
    pthread_mutexattr_destroy(&a);
    __atomic_store_n(&h->magic, EMU_MAGIC, __ATOMIC_RELEASE);
    g.self.hdr = h;
    g.self.pid = g.pid;
    g.self.instance = h->instance;
    g.nblocks = 0;
    g.nsend_posted = 0;
    g.dropped = 0;
    memset(&g.st, 0, sizeof g.st);
    /* Peers (not only our parent) must be allowed to use CMA on us when
     * Yama restricts ptrace to descendants. */
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    return 0;
}

static void write_stats(void)
{
    if (!g.stats_path[0])
        return;
    FILE *f = fopen(g.stats_path, "a");
    if (!f)
        return;
    const char *r = getenv("OMPI_COMM_WORLD_RANK");
    if (!r)
        r = getenv("PMIX_RANK");
    fprintf(f,
            "pid=%d rank=%s send=%" PRIu64 " send_imm=%" PRIu64 " write=%" PRIu64 " write_imm=%" PRIu64
            " read=%" PRIu64 " recv_posted=%" PRIu64 " bytes_out=%" PRIu64 " bytes_in=%" PRIu64
            " rnr_waits=%" PRIu64 " retry_waits=%" PRIu64 " errors=%" PRIu64 " flushes=%" PRIu64 "\n",
            (int)g.pid, r ? r : "-", g.st.send, g.st.send_imm, g.st.write, g.st.write_imm, g.st.read,
            g.st.recv_posted, g.st.bytes_out, g.st.bytes_in, g.st.rnr_waits, g.st.retry_waits,
            g.st.errors, g.st.flushes);
    fclose(f);
}

/* g.lock held */
static void self_seg_destroy(void)
{
    if (!g.self.hdr)
        return;
    write_stats();
    __atomic_store_n(&g.self.hdr->closed, 1, __ATOMIC_RELEASE);
    char name[64];
    seg_name(name, sizeof name, g.pid);
    shm_unlink(name);
    munmap(g.self.hdr, SEG_SIZE);
    g.self.hdr = NULL;
    /* QPs the user never destroyed died with the segment */
    memset(g.qp_by_slot, 0, sizeof g.qp_by_slot);
    for (int i = 0; i < g.nrsegs; i++)
        if (g.rsegs[i].valid)
            munmap(g.rsegs[i].s.hdr, SEG_SIZE);
    g.nrsegs = 0;
}

__attribute__((destructor)) static void emu_fini(void)
{
    pthread_mutex_lock(&g.lock);
    if (g.pid == getpid() && g.self.hdr)
        self_seg_destroy();
    pthread_mutex_unlock(&g.lock);
}

/* The segment of process pid, mapped (cached). NULL when it has none or it
 * was closed. Takes g.lock. */
static struct seg *get_seg(pid_t pid)
{
    if (pid == g.pid)
        return &g.self;
    struct seg *res = NULL;
    pthread_mutex_lock(&g.lock);
    for (int i = 0; i < g.nrsegs; i++) {
        struct rseg *r = &g.rsegs[i];
        if (r->valid && r->s.pid == pid) {
            if (!__atomic_load_n(&r->s.hdr->closed, __ATOMIC_ACQUIRE)) {
                res = &r->s;
                goto out;
            }
            /* closed: a newer instance may exist; keep the old mapping
             * (another thread may still use it) but stop finding it */
            r->valid = 2;
        }
    }
    if (g.nrsegs >= EMU_MAX_RSEGS)
        goto out;
    char name[64];
    seg_name(name, sizeof name, pid);
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0)
        goto out;
    struct stat stt;
    if (fstat(fd, &stt) != 0 || (uint64_t)stt.st_size != SEG_SIZE) {
        close(fd);
        goto out;
    }
    void *m = mmap(NULL, SEG_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        goto out;
    struct shm_hdr *h = m;
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != EMU_MAGIC || h->pid != pid ||
        h->version != EMU_VERSION || __atomic_load_n(&h->closed, __ATOMIC_ACQUIRE)) {
        munmap(m, SEG_SIZE);
        goto out;
    }
    struct rseg *r = &g.rsegs[g.nrsegs++];
    r->s.pid = pid;
    r->s.instance = h->instance;
    r->s.hdr = h;
    r->valid = 1;
    res = &r->s;
out:
    pthread_mutex_unlock(&g.lock);
    return res;
}

/* ---- heap allocator (owner only, g.lock held) ----------------------------- */
static int heap_alloc(uint64_t len, uint64_t *off)
{
    len = (len + 63) & ~63ull;
    if (g.nblocks >= EMU_HEAP_BLOCKS)
        return -1;
    uint64_t pos = 0;
    int i;
    for (i = 0; i < g.nblocks; i++) {
        if (g.blocks[i].off - pos >= len)
            break;
        pos = g.blocks[i].off + g.blocks[i].len;
    }
    if (i == g.nblocks && EMU_HEAP_SIZE - pos < len)
        return -1;
    memmove(&g.blocks[i + 1], &g.blocks[i], sizeof(g.blocks[0]) * (size_t)(g.nblocks - i));
    g.blocks[i].off = pos;
    g.blocks[i].len = len;
    g.nblocks++;
    *off = pos;
    return 0;
}

static void heap_free(uint64_t off)
{
    for (int i = 0; i < g.nblocks; i++)
        if (g.blocks[i].off == off) {
            memmove(&g.blocks[i], &g.blocks[i + 1], sizeof(g.blocks[0]) * (size_t)(g.nblocks - i - 1));
            g.nblocks--;
            return;
        }
}

/* ---- CQs and QP error transitions (segment lock held) --------------------- */
static void qp_to_error_locked(const struct seg *s, uint32_t slot);

static size_t rwr_size(uint32_t nsge) { return sizeof(struct shm_rwr) + sizeof(struct ibv_sge) * nsge; }
static struct shm_rwr *rq_entry(const struct seg *s, struct shm_qp *q, uint32_t idx)
{
    return (struct shm_rwr *)((char *)seg_heap(s, q->rq_off) + rwr_size(q->rq_nsge) * (idx % q->rq_cap));
}

static void cq_push_locked(const struct seg *s, uint32_t cq_slot, const struct emu_cqe *e)
{
    struct shm_cq *cq = seg_cq(s, cq_slot);
    if (!cq->in_use || cq->broken)
        return;
    if (cq->tail - cq->head >= cq->cap) {
        /* overrun: the CQ is in error and so is every QP that uses it */
        cq->broken = 1;
        for (uint32_t i = 0; i < EMU_MAX_QPS; i++) {
            struct shm_qp *q = seg_qp(s, i);
            if (q->in_use && (q->send_cq == cq_slot || q->recv_cq == cq_slot))
                qp_to_error_locked(s, i);
        }
        return;
    }
    struct emu_cqe *ring = seg_heap(s, cq->ring_off);
    ring[cq->tail % cq->cap] = *e;
    __atomic_store_n(&cq->tail, cq->tail + 1, __ATOMIC_RELEASE);
}

static void fill_err_wc(struct ibv_wc *wc, uint64_t wr_id, enum ibv_wc_status st, uint32_t qpn, int recv_side)
{
    memset(wc, 0, sizeof *wc);
    wc->wr_id = wr_id;
    wc->status = st;
    /* not valid in an error completion: deliberately wrong */
    wc->opcode = recv_side ? IBV_WC_RDMA_READ : IBV_WC_RECV_RDMA_WITH_IMM;
    wc->byte_len = EMU_GARBAGE_LEN;
    wc->imm_data = EMU_GARBAGE_IMM;
    wc->wc_flags = IBV_WC_WITH_IMM;
    wc->vendor_err = st == IBV_WC_WR_FLUSH_ERR ? 0xf9 : 0x81;
    wc->qp_num = qpn;
    wc->src_qp = EMU_GARBAGE_IMM & 0xFFFFFF;
}

static void qp_to_error_locked(const struct seg *s, uint32_t slot)
{
    struct shm_qp *q = seg_qp(s, slot);
    if (!q->in_use || q->state == IBV_QPS_ERR)
        return;
    __atomic_store_n(&q->state, (uint32_t)IBV_QPS_ERR, __ATOMIC_RELEASE);
    while (q->rq_head != q->rq_tail) {
        struct shm_rwr *r = rq_entry(s, q, q->rq_head);
        struct emu_cqe e;
        memset(&e, 0, sizeof e);
        fill_err_wc(&e.wc, r->wr_id, IBV_WC_WR_FLUSH_ERR, q->qpn, 1);
        q->rq_head++;
        if (s == &g.self)
            STAT_ADD(flushes, 1);
        cq_push_locked(s, q->recv_cq, &e);
    }
}

/* ---- device list / context ------------------------------------------------ */
EXPORT struct ibv_device **ibv_get_device_list(int *num_devices)
{
    pthread_mutex_lock(&g.lock);
    check_fork();
    if (g.nctx == 0)
        load_config(); /* knobs are re-read while no context is open */
    struct ibv_device **list = calloc((size_t)g.ndev + 1, sizeof *list);
    if (!list) {
        pthread_mutex_unlock(&g.lock);
        errno = ENOMEM;
        return NULL;
    }
    for (int i = 0; i < g.ndev; i++)
        list[i] = &g.devs[i].dev;
    if (num_devices)
        *num_devices = g.ndev;
    pthread_mutex_unlock(&g.lock);
    return list;
}

EXPORT void ibv_free_device_list(struct ibv_device **list) { free(list); }

EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
    return device ? device->name : NULL;
}

static int emu_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
static int emu_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int emu_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
static int emu_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
    (void)cq;
    (void)solicited_only;
    return EOPNOTSUPP; /* no completion channels */
}
static int emu_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    (void)srq;
    *bad = wr;
    return EOPNOTSUPP;
}

EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
    pthread_mutex_lock(&g.lock);
    check_fork();
    struct emu_device *ed = NULL;
    for (int i = 0; i < g.ndev; i++)
        if (device == &g.devs[i].dev)
            ed = &g.devs[i];
    if (!ed) {
        pthread_mutex_unlock(&g.lock);
        errno = ENODEV;
        return NULL;
    }
    struct emu_context *ec = calloc(1, sizeof *ec);
    if (!ec) {
        pthread_mutex_unlock(&g.lock);
        errno = ENOMEM;
        return NULL;
    }
    if (g.nctx == 0 && self_seg_create() != 0) {
        int e = errno;
        free(ec);
        pthread_mutex_unlock(&g.lock);
        errno = e;
        return NULL;
    }
    g.nctx++;
    pthread_mutex_unlock(&g.lock);
    ec->edev = ed;
    pthread_mutex_init(&ec->lock, NULL);
    ec->ctx.device = device;
    ec->ctx.cmd_fd = -1;
    ec->ctx.async_fd = -1;
    ec->ctx.num_comp_vectors = 1;
    pthread_mutex_init(&ec->ctx.mutex, NULL);
    ec->ctx.abi_compat = NULL; /* not a verbs_context: extended inline verbs report ENOSYS */
    ec->ctx.ops.poll_cq = emu_poll_cq;
    ec->ctx.ops.post_send = emu_post_send;
    ec->ctx.ops.post_recv = emu_post_recv;
    ec->ctx.ops.req_notify_cq = emu_req_notify_cq;
    ec->ctx.ops.post_srq_recv = emu_post_srq_recv;
    return &ec->ctx;
}

EXPORT int ibv_close_device(struct ibv_context *context)
{
    struct emu_context *ec = (struct emu_context *)context;
    pthread_mutex_destroy(&ec->lock);
    pthread_mutex_destroy(&ec->ctx.mutex);
    free(ec);
    pthread_mutex_lock(&g.lock);
    if (g.nctx > 0 && --g.nctx == 0)
        self_seg_destroy();
    pthread_mutex_unlock(&g.lock);
    return 0;
}

static struct emu_device *edev_of(struct ibv_context *c) { return ((struct emu_context *)c)->edev; }

EXPORT int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *a)
{
    struct emu_device *ed = edev_of(context);
    memset(a, 0, sizeof *a);
    snprintf(a->fw_ver, sizeof a->fw_ver, "20.99.%04d (weft emu)", ed->index);
    uint8_t gid[16];
    make_gid(g.pid, ed->index, 0, gid);
    uint64_t guid;
    memcpy(&guid, gid + 8, 8);
    a->node_guid = guid;
    a->sys_image_guid = guid;
    a->max_mr_size = 1ull << 46;
    a->page_size_cap = 0xfffffffffffff000ull;
    a->vendor_id = 0x02c9;
    a->vendor_part_id = 4123;
    a->hw_ver = 0;
    a->max_qp = EMU_MAX_QPS;
    a->max_qp_wr = g.max_qp_wr;
    a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT |
                          IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_CHANGE_PHY_PORT;
    a->max_sge = EMU_MAX_SGE;
    a->max_sge_rd = EMU_MAX_SGE;
    a->max_cq = EMU_MAX_CQS;
    a->max_cqe = g.max_cqe;
    a->max_mr = EMU_MAX_MRS;
    a->max_pd = EMU_MAX_PDS;
    a->max_qp_rd_atom = EMU_MAX_RD_ATOM;
    a->max_res_rd_atom = EMU_MAX_RD_ATOM * EMU_MAX_QPS;
    a->max_qp_init_rd_atom = EMU_MAX_RD_ATOM;
    a->atomic_cap = IBV_ATOMIC_NONE;
    a->max_pkeys = 128;
    a->local_ca_ack_delay = 16;
    a->phys_port_cnt = 1;
    return 0;
}

/* verbs.h declares the exported symbol with its ABI-compat struct and wraps
 * it in a macro; the caller (weft, through dlsym) passes a full ibv_port_attr. */
EXPORT int(ibv_query_port)(struct ibv_context *context, uint8_t port_num, struct _compat_ibv_port_attr *compat)
{
    struct ibv_port_attr *a = (struct ibv_port_attr *)(void *)compat;
    struct emu_device *ed = edev_of(context);
    if (port_num != 1)
        return EINVAL;
    memset(a, 0, sizeof *a);
    a->state = ed->port_down ? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
    a->max_mtu = IBV_MTU_4096;
    a->active_mtu = (enum ibv_mtu)g.mtu_enum;
    a->gid_tbl_len = gid_tbl_len();
    a->port_cap_flags = g.roce ? 0x04010000u : 0x2651e848u;
    a->max_msg_sz = (uint32_t)g.max_msg;
    a->pkey_tbl_len = 128;
    a->lid = g.roce ? 0 : make_lid(g.pid, ed->index);
    a->sm_lid = g.roce ? 0 : 1;
    a->max_vl_num = 4;
    a->subnet_timeout = 18;
    a->active_width = 2;   /* 4x */
    a->active_speed = 32;  /* EDR */
    a->phys_state = ed->port_down ? 3 : 5;
    a->link_layer = g.roce ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
    return 0;
}

EXPORT int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid)
{
    struct emu_device *ed = edev_of(context);
    if (port_num != 1 || index < 0 || index >= gid_tbl_len()) {
        errno = EINVAL;
        return -1;
    }
    if (gid_populated(index))
        make_gid(g.pid, ed->index, index, gid->raw);
    else
        memset(gid->raw, 0, 16);
    return 0;
}

EXPORT int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
                             struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
    struct emu_device *ed = edev_of(context);
    if (flags || entry_size < sizeof *entry || port_num != 1)
        return EINVAL;
    if (gid_index >= (uint32_t)gid_tbl_len())
        return EINVAL;
    if (!gid_populated((int)gid_index))
        return ENODATA;
    memset(entry, 0, sizeof *entry);
    make_gid(g.pid, ed->index, (int)gid_index, entry->gid.raw);
    entry->gid_index = gid_index;
    entry->port_num = port_num;
    entry->gid_type = gid_type_of((int)gid_index);
    entry->ndev_ifindex = g.roce ? (uint32_t)(10 + ed->index) : 0;
    return 0;
}

/* ---- PD / MR ------------------------------------------------------------------ */
EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
    struct emu_pd *p = calloc(1, sizeof *p);
    if (!p) {
        errno = ENOMEM;
        return NULL;
    }
    pthread_mutex_lock(&g.lock);
    int id = -1;
    for (int i = 1; i < EMU_MAX_PDS; i++)
        if (!g.pd_used[i]) {
            id = i;
            break;
        }
    if (id < 0) {
        pthread_mutex_unlock(&g.lock);
        free(p);
        errno = ENOMEM;
        return NULL;
    }
    g.pd_used[id] = 1;
    pthread_mutex_unlock(&g.lock);
    p->id = (uint32_t)id;
    p->pd.context = context;
    p->pd.handle = (uint32_t)id;
    return &p->pd;
}

EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
    struct emu_pd *p = (struct emu_pd *)pd;
    pthread_mutex_lock(&g.lock);
    if (p->nref) {
        pthread_mutex_unlock(&g.lock);
        return EBUSY;
    }
    g.pd_used[p->id] = 0;
    pthread_mutex_unlock(&g.lock);
    free(p);
    return 0;
}

/* is [addr, addr+len) mapped in this process? */
static int range_mapped(uint64_t addr, uint64_t len)
{
    if (len == 0)
        return 1;
    char b;
    uint64_t probe[2] = { addr, addr + len - 1 };
    for (int i = 0; i < 2; i++) {
        struct iovec l = { &b, 1 }, r = { (void *)(uintptr_t)probe[i], 1 };
        if (process_vm_readv(getpid(), &l, 1, &r, 1, 0) != 1)
            return 0;
    }
    return 1;
}

static int access_ok(int access)
{
    const int known = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                      IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_RELAXED_ORDERING;
    return !(access & ~known) &&
           !((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE));
}

/* Enters an MR for [addr, addr+length) (alias: see struct shm_mr; map,
 * map_len: the dma-buf mapping the MR owns from now on). Sets errno. */
static struct ibv_mr *reg_common(struct ibv_pd *pd, uint64_t addr, size_t length, int access, uint64_t alias,
                                 void *map, size_t map_len)
{
    struct emu_pd *p = (struct emu_pd *)pd;
    struct emu_mr *m = calloc(1, sizeof *m);
    if (!m) {
        errno = ENOMEM;
        return NULL;
    }
    pthread_mutex_lock(&g.lock);
    if (!g.self.hdr) {
        pthread_mutex_unlock(&g.lock);
        free(m);
        errno = EINVAL;
        return NULL;
    }
    int slot = -1;
    for (uint32_t k = 0; k < EMU_MAX_MRS; k++) {
        uint32_t i = (g.next_mr + k) % EMU_MAX_MRS;
        if (!seg_mr(&g.self, i)->in_use) {
            slot = (int)i;
            break;
        }
    }
    if (slot < 0) {
        pthread_mutex_unlock(&g.lock);
        free(m);
        errno = ENOMEM;
        return NULL;
    }
    g.next_mr = (uint32_t)slot + 1;
    uint32_t gen = ++g.mr_gen[slot];
    uint32_t key = ((uint32_t)slot << 8) | (gen & 0xFF);
    p->nref++;
    seg_lock(&g.self);
    struct shm_mr *sm = seg_mr(&g.self, (uint32_t)slot);
    sm->key = key;
    sm->pd_id = p->id;
    sm->access = (uint32_t)access;
    sm->addr = addr;
    sm->length = length;
    sm->alias = alias;
    sm->in_use = 1;
    seg_unlock(&g.self);
    pthread_mutex_unlock(&g.lock);

    m->slot = (uint32_t)slot;
    m->epd = p;
    m->map = map;
    m->map_len = map_len;
    m->mr.context = pd->context;
    m->mr.pd = pd;
    m->mr.addr = (void *)(uintptr_t)addr;
    m->mr.length = length;
    m->mr.handle = (uint32_t)slot;
    m->mr.lkey = key;
    m->mr.rkey = key;
    return &m->mr;
}

/* The range an emulated dma-buf descriptor stands for: *first (byte offset
 * in the file) and *size. 0, or an errno: EBADF (not a descriptor), EINVAL
 * (not a dma-buf: the kernel's dma_buf_get says so too). */
static int dmabuf_decode(int fd, uint64_t *first, uint64_t *size)
{
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0)
        return EBADF;
    if (!S_ISREG(st.st_mode))
        return EINVAL;
    off_t pos = lseek(fd, 0, SEEK_CUR);
    if (pos < 0 || ((uint64_t)pos >> 56) != EMU_DMABUF_TAG)
        return EINVAL;
    const uint64_t mask = (1ull << EMU_DMABUF_FIELD) - 1;
    *first = (((uint64_t)pos >> EMU_DMABUF_FIELD) & mask) * EMU_PAGE;
    *size = ((uint64_t)pos & mask) * EMU_PAGE;
    if (*size == 0 || *first + *size > (uint64_t)st.st_size)
        return EINVAL;
    return 0;
}

static struct ibv_mr *reg_dmabuf(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                                 int access)
{
    /* mlx5 (mkeys of PAGE_SIZE pages) needs iova and offset to agree within
     * a page; the kernel refuses a range past the dma-buf's end. */
    if (!access_ok(access) || length == 0 || length > (1ull << 46) || offset + length < offset ||
        iova + length < iova || ((iova ^ offset) & (EMU_PAGE - 1))) {
        errno = EINVAL;
        return NULL;
    }
    uint64_t first, size;
    int e = dmabuf_decode(fd, &first, &size);
    if (e) {
        errno = e;
        return NULL;
    }
    if (offset + length > size) {
        errno = EINVAL;
        return NULL;
    }
    uint64_t at = first + offset, pgoff = at & (EMU_PAGE - 1);
    size_t map_len = (size_t)((pgoff + length + EMU_PAGE - 1) & ~(EMU_PAGE - 1));
    void *map = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)(at - pgoff));
    if (map == MAP_FAILED)
        return NULL; /* errno from mmap */
    struct ibv_mr *mr = reg_common(pd, iova, length, access, (uint64_t)(uintptr_t)map + pgoff, map, map_len);
    if (!mr) {
        e = errno;
        munmap(map, map_len);
        errno = e;
    }
    return mr;
}

/* WEFT_EMU_VERBS_PEERMEM: what nvidia-peermem does for ibv_reg_mr of device
 * memory, asked of libweft_emu_cuda.so when it is loaded: an emulated dma-buf
 * of the pages covering [addr, addr+length), or -1. */
static int peermem_fd(const void *addr, size_t length)
{
    void *h = dlopen("libweft_emu_cuda.so", RTLD_LAZY | RTLD_NOLOAD);
    if (!h)
        return -1;
    int (*fn)(const void *, size_t);
    *(void **)&fn = dlsym(h, "weft_emu_cuda_peermem_fd");
    int fd = fn ? fn(addr, length) : -1;
    dlclose(h);
    return fd;
}

EXPORT struct ibv_mr *(ibv_reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    if (!access_ok(access) || length > (1ull << 46) || (uintptr_t)addr + length < (uintptr_t)addr) {
        errno = EINVAL;
        return NULL;
    }
    if (!range_mapped((uintptr_t)addr, length)) {
        /* Device memory the host cannot touch: a NIC without a peer-memory
         * module cannot pin it either. */
        int fd = g.peermem ? peermem_fd(addr, length) : -1;
        if (fd < 0) {
            errno = EFAULT;
            return NULL;
        }
        uint64_t iova = (uintptr_t)addr;
        struct ibv_mr *mr = reg_dmabuf(pd, iova & (EMU_PAGE - 1), length, iova, fd, access);
        int e = errno;
        close(fd);
        errno = e;
        return mr;
    }
    return reg_common(pd, (uintptr_t)addr, length, access, 0, NULL, 0);
}

EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                                        int access)
{
    return reg_dmabuf(pd, offset, length, iova, fd, access);
}

EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
    struct emu_mr *m = (struct emu_mr *)mr;
    seg_lock(&g.self);
    seg_mr(&g.self, m->slot)->in_use = 0;
    seg_mr(&g.self, m->slot)->key = 0;
    seg_unlock(&g.self);
    pthread_mutex_lock(&g.lock);
    m->epd->nref--;
    pthread_mutex_unlock(&g.lock);
    /* no peer is inside the MR now: they check and copy under our segment lock */
    if (m->map)
        munmap(m->map, m->map_len);
    free(m);
    return 0;
}

/* ---- CQ --------------------------------------------------------------------- */
EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
                                    struct ibv_comp_channel *channel, int comp_vector)
{
    if (cqe < 1 || cqe > g.max_cqe || comp_vector < 0 || comp_vector >= context->num_comp_vectors) {
        errno = EINVAL;
        return NULL;
    }
    if (channel) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    /* as mlx5: the CQ holds the next power of two minus one */
    uint32_t cap = 1;
    while (cap < (uint32_t)cqe + 1)
        cap <<= 1;
    cap -= 1;
    struct emu_cq *c = calloc(1, sizeof *c);
    if (!c) {
        errno = ENOMEM;
        return NULL;
    }
    pthread_mutex_lock(&g.lock);
    int slot = -1;
    for (int i = 0; i < EMU_MAX_CQS; i++)
        if (!seg_cq(&g.self, (uint32_t)i)->in_use) {
            slot = i;
            break;
        }
    uint64_t off;
    if (slot < 0 || heap_alloc((uint64_t)cap * sizeof(struct emu_cqe), &off) != 0) {
        pthread_mutex_unlock(&g.lock);
        free(c);
        errno = ENOMEM;
        return NULL;
    }
    seg_lock(&g.self);
    struct shm_cq *sc = seg_cq(&g.self, (uint32_t)slot);
    sc->gen++;
    sc->cap = cap;
    sc->head = sc->tail = 0;
    sc->broken = 0;
    sc->ring_off = off;
    sc->in_use = 1;
    seg_unlock(&g.self);
    pthread_mutex_unlock(&g.lock);
    c->slot = (uint32_t)slot;
    c->cq.context = context;
    c->cq.channel = NULL;
    c->cq.cq_context = cq_context;
    c->cq.handle = (uint32_t)slot;
    c->cq.cqe = (int)cap;
    pthread_mutex_init(&c->cq.mutex, NULL);
    pthread_cond_init(&c->cq.cond, NULL);
    return &c->cq;
}

EXPORT int ibv_destroy_cq(struct ibv_cq *cq)
{
    struct emu_cq *c = (struct emu_cq *)cq;
    struct emu_context *ec = (struct emu_context *)cq->context;
    pthread_mutex_lock(&ec->lock);
    pthread_mutex_lock(&g.lock);
    if (c->nref) {
        pthread_mutex_unlock(&g.lock);
        pthread_mutex_unlock(&ec->lock);
        return EBUSY;
    }
    seg_lock(&g.self);
    struct shm_cq *sc = seg_cq(&g.self, c->slot);
    sc->in_use = 0;
    sc->gen++;
    uint64_t off = sc->ring_off;
    seg_unlock(&g.self);
    heap_free(off);
    pthread_mutex_unlock(&g.lock);
    pthread_mutex_unlock(&ec->lock);
    pthread_mutex_destroy(&c->cq.mutex);
    pthread_cond_destroy(&c->cq.cond);
    free(c);
    return 0;
}

/* ---- QP ------------------------------------------------------------------------ */
EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
    struct emu_pd *p = (struct emu_pd *)pd;
    struct emu_context *ec = (struct emu_context *)pd->context;
    struct ibv_qp_cap *cap = &attr->cap;
    if (attr->qp_type != IBV_QPT_RC || attr->srq) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    if (!attr->send_cq || !attr->recv_cq || attr->send_cq->context != pd->context ||
        attr->recv_cq->context != pd->context || cap->max_send_wr > (uint32_t)g.max_qp_wr ||
        cap->max_recv_wr > (uint32_t)g.max_qp_wr || cap->max_send_sge > EMU_MAX_SGE ||
        cap->max_recv_sge > EMU_MAX_SGE || cap->max_inline_data > (uint32_t)g.max_inline) {
        errno = EINVAL;
        return NULL;
    }
    struct emu_qp *q = calloc(1, sizeof *q);
    uint32_t sq_cap = cap->max_send_wr ? cap->max_send_wr : 1;
    if (q) {
        q->sq = calloc(sq_cap, sizeof *q->sq);
        q->inl_buf = calloc(sq_cap, cap->max_inline_data ? cap->max_inline_data : 1);
    }
    if (!q || !q->sq || !q->inl_buf) {
        if (q) {
            free(q->sq);
            free(q->inl_buf);
        }
        free(q);
        errno = ENOMEM;
        return NULL;
    }
    uint32_t rq_cap = cap->max_recv_wr ? cap->max_recv_wr : 1;
    uint32_t rq_nsge = cap->max_recv_sge;
    pthread_mutex_lock(&ec->lock);
    pthread_mutex_lock(&g.lock);
    int slot = -1;
    for (int i = 0; i < EMU_MAX_QPS; i++)
        if (!g.qp_by_slot[i] && !seg_qp(&g.self, (uint32_t)i)->in_use) {
            slot = i;
            break;
        }
    uint64_t off;
    if (slot < 0 || heap_alloc((uint64_t)rq_cap * rwr_size(rq_nsge), &off) != 0) {
        pthread_mutex_unlock(&g.lock);
        pthread_mutex_unlock(&ec->lock);
        free(q->sq);
        free(q->inl_buf);
        free(q);
        errno = ENOMEM;
        return NULL;
    }
    struct emu_cq *scq = (struct emu_cq *)attr->send_cq, *rcq = (struct emu_cq *)attr->recv_cq;
    scq->nref++;
    rcq->nref++;
    p->nref++;
    g.qp_by_slot[slot] = q;
    seg_lock(&g.self);
    struct shm_qp *sq = seg_qp(&g.self, (uint32_t)slot);
    uint32_t gen = sq->gen + 1;
    memset(sq, 0, sizeof *sq);
    sq->gen = gen;
    sq->qpn = make_qpn(g.pid, (uint32_t)slot);
    sq->state = IBV_QPS_RESET;
    sq->dev = (uint32_t)ec->edev->index;
    sq->pd_id = p->id;
    sq->send_cq = scq->slot;
    sq->recv_cq = rcq->slot;
    sq->roce = (uint32_t)g.roce;
    sq->rq_off = off;
    sq->rq_cap = rq_cap;
    sq->rq_nsge = rq_nsge;
    sq->in_use = 1;
    seg_unlock(&g.self);
    pthread_mutex_unlock(&g.lock);

    q->ec = ec;
    q->slot = (uint32_t)slot;
    q->gen = gen;
    q->epd = p;
    q->scq = scq;
    q->rcq = rcq;
    q->sq_cap = cap->max_send_wr;
    q->max_inline = cap->max_inline_data;
    q->max_send_sge = cap->max_send_sge;
    q->max_recv_sge = cap->max_recv_sge;
    q->max_recv_wr = cap->max_recv_wr;
    q->sig_all = attr->sq_sig_all;
    q->qp.context = pd->context;
    q->qp.qp_context = attr->qp_context;
    q->qp.pd = pd;
    q->qp.send_cq = attr->send_cq;
    q->qp.recv_cq = attr->recv_cq;
    q->qp.srq = NULL;
    q->qp.handle = (uint32_t)slot;
    q->qp.qp_num = make_qpn(g.pid, (uint32_t)slot);
    q->qp.state = IBV_QPS_RESET;
    q->qp.qp_type = IBV_QPT_RC;
    pthread_mutex_init(&q->qp.mutex, NULL);
    pthread_cond_init(&q->qp.cond, NULL);
    q->next = ec->qps;
    ec->qps = q;
    pthread_mutex_unlock(&ec->lock);
    /* granted exactly what was asked */
    return &q->qp;
}

EXPORT int ibv_destroy_qp(struct ibv_qp *qp)
{
    struct emu_qp *q = (struct emu_qp *)qp;
    struct emu_context *ec = q->ec;
    pthread_mutex_lock(&ec->lock);
    for (struct emu_qp **pp = &ec->qps; *pp; pp = &(*pp)->next)
        if (*pp == q) {
            *pp = q->next;
            break;
        }
    pthread_mutex_lock(&g.lock);
    seg_lock(&g.self);
    struct shm_qp *sq = seg_qp(&g.self, q->slot);
    uint64_t off = sq->rq_off;
    sq->in_use = 0;
    sq->state = IBV_QPS_RESET;
    sq->gen++;
    seg_unlock(&g.self);
    heap_free(off);
    g.qp_by_slot[q->slot] = NULL;
    q->scq->nref--;
    q->rcq->nref--;
    q->epd->nref--;
    pthread_mutex_unlock(&g.lock);
    pthread_mutex_unlock(&ec->lock);
    pthread_mutex_destroy(&q->qp.mutex);
    pthread_cond_destroy(&q->qp.cond);
    free(q->sq);
    free(q->inl_buf);
    free(q);
    return 0;
}

static int modify_allowed(int cur, int nxt, int mask, int *req_out, int *opt_out)
{
    int req = 0, opt = 0;
    if (nxt == IBV_QPS_RESET || nxt == IBV_QPS_ERR) {
        req = IBV_QP_STATE;
    } else if (cur == IBV_QPS_RESET && nxt == IBV_QPS_INIT) {
        req = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    } else if (cur == IBV_QPS_INIT && nxt == IBV_QPS_INIT) {
        req = IBV_QP_STATE;
        opt = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    } else if (cur == IBV_QPS_INIT && nxt == IBV_QPS_RTR) {
        req = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
        opt = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
    } else if (cur == IBV_QPS_RTR && nxt == IBV_QPS_RTS) {
        req = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
              IBV_QP_MAX_QP_RD_ATOMIC;
        opt = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_ALT_PATH |
              IBV_QP_PATH_MIG_STATE;
    } else if (cur == IBV_QPS_RTS && nxt == IBV_QPS_RTS) {
        req = IBV_QP_STATE;
        opt = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_ALT_PATH |
              IBV_QP_PATH_MIG_STATE;
    } else {
        return 0;
    }
    *req_out = req;
    *opt_out = opt;
    return (mask & req) == req && (mask & ~(req | opt)) == 0;
}

EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
    struct emu_qp *q = (struct emu_qp *)qp;
    struct emu_context *ec = q->ec;
    pthread_mutex_lock(&ec->lock);
    seg_lock(&g.self);
    struct shm_qp *sq = seg_qp(&g.self, q->slot);
    int cur = (int)sq->state, nxt = (int)attr->qp_state;
    if (!(attr_mask & IBV_QP_STATE)) { /* attributes only: a transition to the same state */
        nxt = cur;
        attr_mask |= IBV_QP_STATE;
    }
    int req, opt, rc = EINVAL;
    if (!modify_allowed(cur, nxt, attr_mask, &req, &opt))
        goto out;
    if ((attr_mask & IBV_QP_CUR_STATE) && (int)attr->cur_qp_state != cur)
        goto out;
    if ((attr_mask & IBV_QP_PORT) && attr->port_num != 1)
        goto out;
    if ((attr_mask & IBV_QP_PKEY_INDEX) && attr->pkey_index >= 128)
        goto out;
    if ((attr_mask & IBV_QP_ACCESS_FLAGS) &&
        (attr->qp_access_flags & ~(unsigned)(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                             IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)))
        goto out;
    if (attr_mask & IBV_QP_PATH_MTU) {
        if (attr->path_mtu < IBV_MTU_256 || attr->path_mtu > IBV_MTU_4096 || (int)attr->path_mtu > g.mtu_enum)
            goto out;
    }
    if (attr_mask & IBV_QP_AV) {
        const struct ibv_ah_attr *ah = &attr->ah_attr;
        if (ah->port_num > 1)
            goto out;
        if (g.roce) {
            if (!ah->is_global || !gid_populated(ah->grh.sgid_index))
                goto out;
        } else {
            if (ah->dlid == 0 || ah->dlid >= 0xC000)
                goto out;
            if (ah->is_global && ah->grh.sgid_index >= gid_tbl_len())
                goto out;
        }
    }
    if ((attr_mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr->max_dest_rd_atomic > EMU_MAX_RD_ATOM)
        goto out;
    if ((attr_mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr->max_rd_atomic > EMU_MAX_RD_ATOM)
        goto out;
    if ((attr_mask & IBV_QP_MIN_RNR_TIMER) && attr->min_rnr_timer > 31)
        goto out;
    if ((attr_mask & IBV_QP_TIMEOUT) && attr->timeout > 31)
        goto out;
    if ((attr_mask & IBV_QP_RETRY_CNT) && attr->retry_cnt > 7)
        goto out;
    if ((attr_mask & IBV_QP_RNR_RETRY) && attr->rnr_retry > 7)
        goto out;
    if (nxt == IBV_QPS_RTR && ec->edev->port_down)
        goto out;

    /* apply */
    rc = 0;
    if (nxt == IBV_QPS_RESET) {
        uint32_t keep_gen = sq->gen, keep_qpn = sq->qpn, keep_dev = sq->dev, keep_pd = sq->pd_id;
        uint32_t scq = sq->send_cq, rcq = sq->recv_cq, roce = sq->roce, cap = sq->rq_cap, nsge = sq->rq_nsge;
        uint64_t off = sq->rq_off;
        memset(sq, 0, sizeof *sq);
        sq->gen = keep_gen;
        sq->qpn = keep_qpn;
        sq->dev = keep_dev;
        sq->pd_id = keep_pd;
        sq->send_cq = scq;
        sq->recv_cq = rcq;
        sq->roce = roce;
        sq->rq_cap = cap;
        sq->rq_nsge = nsge;
        sq->rq_off = off;
        sq->in_use = 1;
        q->sq_head = q->sq_exec = q->sq_tail = 0;
        __atomic_store_n(&sq->state, (uint32_t)IBV_QPS_RESET, __ATOMIC_RELEASE);
        goto out;
    }
    if (nxt == IBV_QPS_ERR) {
        qp_to_error_locked(&g.self, q->slot);
        goto out;
    }
    if (attr_mask & IBV_QP_ACCESS_FLAGS)
        sq->access = attr->qp_access_flags;
    if (attr_mask & IBV_QP_PATH_MTU)
        sq->path_mtu = attr->path_mtu;
    if (attr_mask & IBV_QP_DEST_QPN)
        sq->dest_qpn = attr->dest_qp_num & 0xFFFFFF;
    if (attr_mask & IBV_QP_RQ_PSN)
        sq->rq_psn = attr->rq_psn & 0xFFFFFF;
    if (attr_mask & IBV_QP_SQ_PSN)
        sq->sq_psn = attr->sq_psn & 0xFFFFFF;
    if (attr_mask & IBV_QP_MAX_DEST_RD_ATOMIC)
        sq->max_dest_rd = attr->max_dest_rd_atomic;
    if (attr_mask & IBV_QP_MAX_QP_RD_ATOMIC)
        sq->max_rd = attr->max_rd_atomic;
    if (attr_mask & IBV_QP_MIN_RNR_TIMER)
        sq->min_rnr_timer = attr->min_rnr_timer;
    if (attr_mask & IBV_QP_AV) {
        const struct ibv_ah_attr *ah = &attr->ah_attr;
        int dev = ec->edev->index;
        sq->dlid = ah->dlid;
        sq->own_lid = g.roce ? 0 : make_lid(g.pid, dev);
        if (g.roce) {
            memcpy(sq->dgid, ah->grh.dgid.raw, 16);
            make_gid(g.pid, dev, ah->grh.sgid_index, sq->sgid);
            sq->sgid_type = gid_type_of(ah->grh.sgid_index);
        }
    }
    if (attr_mask & IBV_QP_TIMEOUT)
        q->timeout = attr->timeout;
    if (attr_mask & IBV_QP_RETRY_CNT)
        q->retry_cnt = attr->retry_cnt;
    if (attr_mask & IBV_QP_RNR_RETRY)
        q->rnr_retry = attr->rnr_retry;
    __atomic_store_n(&sq->state, (uint32_t)nxt, __ATOMIC_RELEASE);
out:
    if (rc == 0)
        qp->state = (enum ibv_qp_state)sq->state;
    seg_unlock(&g.self);
    pthread_mutex_unlock(&ec->lock);
    return rc;
}

/* ---- data path: posting ------------------------------------------------------ */
static uint32_t qp_state(uint32_t slot)
{
    return __atomic_load_n(&seg_qp(&g.self, slot)->state, __ATOMIC_ACQUIRE);
}

static int emu_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    struct emu_qp *q = (struct emu_qp *)qp;
    struct emu_context *ec = q->ec;
    int rc = 0;
    pthread_mutex_lock(&ec->lock);
    for (; wr; wr = wr->next) {
        uint32_t st = qp_state(q->slot);
        if (st != IBV_QPS_RTS && st != IBV_QPS_ERR) {
            rc = EINVAL;
            break;
        }
        if (wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM && wr->opcode != IBV_WR_RDMA_WRITE &&
            wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM && wr->opcode != IBV_WR_RDMA_READ) {
            rc = EINVAL;
            break;
        }
        if (wr->num_sge < 0 || (uint32_t)wr->num_sge > q->max_send_sge) {
            rc = EINVAL;
            break;
        }
        if (q->sq_tail - q->sq_head >= q->sq_cap) {
            rc = ENOMEM;
            break;
        }
        uint64_t len = 0;
        for (int i = 0; i < wr->num_sge; i++)
            len += wr->sg_list[i].length;
        int inl = (wr->send_flags & IBV_SEND_INLINE) != 0;
        if (inl && (wr->opcode == IBV_WR_RDMA_READ || len > q->max_inline)) {
            rc = EINVAL;
            break;
        }
        uint32_t idx = (uint32_t)(q->sq_tail % q->sq_cap);
        struct swr *w = &q->sq[idx];
        memset(w, 0, offsetof(struct swr, sg));
        w->wr_id = wr->wr_id;
        w->opcode = wr->opcode;
        w->signaled = q->sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
        w->inl = inl;
        w->len = len;
        w->num_sge = (uint32_t)wr->num_sge;
        if (inl) {
            uint8_t *dst = q->inl_buf + (size_t)idx * (q->max_inline ? q->max_inline : 1);
            for (int i = 0; i < wr->num_sge; i++) {
                memcpy(dst, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
                dst += wr->sg_list[i].length;
            }
        } else {
            for (int i = 0; i < wr->num_sge; i++)
                w->sg[i] = wr->sg_list[i];
        }
        if (wr->opcode == IBV_WR_SEND_WITH_IMM || wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
            w->imm = wr->imm_data;
        if (wr->opcode == IBV_WR_RDMA_WRITE || wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ||
            wr->opcode == IBV_WR_RDMA_READ) {
            w->raddr = wr->wr.rdma.remote_addr;
            w->rkey = wr->wr.rdma.rkey;
        }
        uint64_t n = ++g.nsend_posted;
        if (g.faults_here && g.fail_wr && n == g.fail_wr)
            w->fault = 1;
        /* DROP_AFTER: the HCA leaves the fabric once the Nth has executed */
        if (g.faults_here && g.drop_after && n >= g.drop_after)
            w->drop = n == g.drop_after ? 1 : 2;
        q->sq_tail++;
    }
    if (rc && bad)
        *bad = wr;
    pthread_mutex_unlock(&ec->lock);
    return rc;
}

static int emu_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    struct emu_qp *q = (struct emu_qp *)qp;
    int rc = 0;
    seg_lock(&g.self);
    struct shm_qp *sq = seg_qp(&g.self, q->slot);
    for (; wr; wr = wr->next) {
        if (sq->state == IBV_QPS_RESET) {
            rc = EINVAL;
            break;
        }
        if (wr->num_sge < 0 || (uint32_t)wr->num_sge > q->max_recv_sge) {
            rc = EINVAL;
            break;
        }
        if (sq->rq_tail - sq->rq_head >= q->max_recv_wr) {
            rc = ENOMEM;
            break;
        }
        STAT_ADD(recv_posted, 1);
        if (sq->state == IBV_QPS_ERR) {
            struct emu_cqe e;
            memset(&e, 0, sizeof e);
            fill_err_wc(&e.wc, wr->wr_id, IBV_WC_WR_FLUSH_ERR, sq->qpn, 1);
            STAT_ADD(flushes, 1);
            cq_push_locked(&g.self, sq->recv_cq, &e);
            continue;
        }
        struct shm_rwr *r = rq_entry(&g.self, sq, sq->rq_tail);
        r->wr_id = wr->wr_id;
        r->num_sge = (uint32_t)wr->num_sge;
        for (int i = 0; i < wr->num_sge; i++)
            r->sg[i] = wr->sg_list[i];
        sq->rq_tail++;
    }
    seg_unlock(&g.self);
    if (rc && bad)
        *bad = wr;
    return rc;
}

/* ---- data path: execution ------------------------------------------------------ */
enum { X_DONE, X_WAIT };

static uint64_t retry_ns(const struct emu_qp *q)
{
    if (q->timeout == 0)
        return EMU_RETRY_CAP_NS; /* infinite on hardware */
    long double t = 4096.0L * (long double)(1ull << q->timeout) * (q->retry_cnt + 1);
    return t > EMU_RETRY_CAP_NS ? EMU_RETRY_CAP_NS : (uint64_t)t;
}

static uint64_t rnr_delay_ns(uint32_t timer)
{
    static const uint32_t us[32] = { 655360, 10,    20,    30,    40,    60,    80,    120,
                                     160,    240,   320,   480,   640,   960,   1280,  1920,
                                     2560,   3840,  5120,  7680,  10240, 15360, 20480, 30720,
                                     40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520 };
    return (uint64_t)us[timer & 31] * 1000ull;
}

/* local SGEs: lkey, PD, bounds (and LOCAL_WRITE when we write into them) */
static int check_local(const struct emu_qp *q, const struct swr *w, int need_write, struct iovec *iov, int *niov)
{
    *niov = 0;
    if (w->inl) {
        if (w->len) {
            iov[0].iov_base = q->inl_buf + (size_t)(w - q->sq) * (q->max_inline ? q->max_inline : 1);
            iov[0].iov_len = w->len;
            *niov = 1;
        }
        return 0;
    }
    int bad = 0;
    seg_lock(&g.self);
    for (uint32_t i = 0; i < w->num_sge && !bad; i++) {
        const struct ibv_sge *s = &w->sg[i];
        if (!s->length)
            continue;
        uint32_t slot = s->lkey >> 8;
        struct shm_mr *m = slot < EMU_MAX_MRS ? seg_mr(&g.self, slot) : NULL;
        if (!m || !m->in_use || m->key != s->lkey || m->pd_id != q->epd->id || s->addr < m->addr ||
            s->addr + s->length > m->addr + m->length || (need_write && !(m->access & IBV_ACCESS_LOCAL_WRITE)))
            bad = 1;
        iov[*niov].iov_base = bad ? (void *)(uintptr_t)s->addr : mr_where(m, s->addr);
        iov[*niov].iov_len = s->length;
        (*niov)++;
    }
    seg_unlock(&g.self);
    return bad;
}

/* remote MR check on the target (its lock held); *where: the target's
 * address of addr (mr_where) */
static int check_rkey(const struct seg *t, const struct shm_qp *tq, uint32_t rkey, uint64_t addr, uint64_t len,
                      uint32_t need, void **where)
{
    *where = (void *)(uintptr_t)addr;
    if (!(tq->access & need))
        return 1;
    uint32_t slot = rkey >> 8;
    if (slot >= EMU_MAX_MRS)
        return 1;
    const struct shm_mr *m = seg_mr(t, slot);
    if (!m->in_use || m->key != rkey || m->pd_id != tq->pd_id || !(m->access & need))
        return 1;
    if (addr < m->addr || addr + len < addr || addr + len > m->addr + m->length)
        return 1;
    *where = mr_where(m, addr);
    return 0;
}

/* data between our iovecs and the target's; 0 on success */
static int cma(pid_t pid, struct iovec *l, int nl, struct iovec *r, int nr, uint64_t len, int write)
{
    uint64_t done = 0;
    int li = 0, ri = 0;
    size_t loff = 0, roff = 0;
    while (done < len) {
        /* build up to 64 iovecs each side from the current positions */
        struct iovec lv[64], rv[64];
        int nlv = 0, nrv = 0;
        uint64_t chunk = 0;
        int i = li;
        size_t o = loff;
        while (i < nl && nlv < 64) {
            if (l[i].iov_len - o) {
                lv[nlv].iov_base = (char *)l[i].iov_base + o;
                lv[nlv].iov_len = l[i].iov_len - o;
                chunk += lv[nlv].iov_len;
                nlv++;
            }
            i++;
            o = 0;
        }
        uint64_t rchunk = 0;
        i = ri;
        o = roff;
        while (i < nr && nrv < 64) {
            if (r[i].iov_len - o) {
                rv[nrv].iov_base = (char *)r[i].iov_base + o;
                rv[nrv].iov_len = r[i].iov_len - o;
                rchunk += rv[nrv].iov_len;
                nrv++;
            }
            i++;
            o = 0;
        }
        if (!nlv || !nrv)
            return -1;
        (void)chunk;
        (void)rchunk;
        ssize_t n = write ? process_vm_writev(pid, lv, (unsigned long)nlv, rv, (unsigned long)nrv, 0)
                          : process_vm_readv(pid, lv, (unsigned long)nlv, rv, (unsigned long)nrv, 0);
        if (n <= 0) {
            static int warned;
            if (n < 0 && errno == EPERM && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
                fprintf(stderr, "weft_emu_verbs: process_vm_%sv(pid %d): %s (CMA not permitted)\n",
                        write ? "write" : "read", (int)pid, strerror(errno));
            return -1;
        }
        done += (uint64_t)n;
        /* advance both cursors by n */
        uint64_t adv = (uint64_t)n;
        while (adv && li < nl) {
            size_t rem = l[li].iov_len - loff;
            if (adv >= rem) {
                adv -= rem;
                li++;
                loff = 0;
            } else {
                loff += adv;
                adv = 0;
            }
        }
        adv = (uint64_t)n;
        while (adv && ri < nr) {
            size_t rem = r[ri].iov_len - roff;
            if (adv >= rem) {
                adv -= rem;
                ri++;
                roff = 0;
            } else {
                roff += adv;
                adv = 0;
            }
        }
    }
    return 0;
}

/* "The cable is pulled": nobody reaches this HCA any more and it reaches
 * nobody; WRs on either side time out (IBV_WC_RETRY_EXC_ERR), which puts
 * their QPs in error, which flushes the rest. */
static void do_drop(void)
{
    if (__atomic_exchange_n(&g.dropped, 1, __ATOMIC_ACQ_REL))
        return;
    __atomic_store_n(&g.self.hdr->dropped, 1, __ATOMIC_RELEASE);
}

static int peer_alive(const struct seg *t)
{
    if (__atomic_load_n(&t->hdr->closed, __ATOMIC_ACQUIRE) || __atomic_load_n(&t->hdr->dropped, __ATOMIC_ACQUIRE))
        return 0;
    if (t->pid != g.pid && kill(t->pid, 0) == -1 && errno == ESRCH)
        return 0;
    return 1;
}

/* Is the target QP connected to us (target lock held)? */
static int connected(const struct shm_qp *me, const struct shm_qp *tq, uint32_t dest_qpn, int tdev)
{
    if (!tq->in_use || tq->qpn != dest_qpn || (int)tq->dev != tdev)
        return 0;
    if (tq->state != IBV_QPS_RTR && tq->state != IBV_QPS_RTS)
        return 0;
    if (tq->dest_qpn != me->qpn || tq->rq_psn != me->sq_psn)
        return 0;
    if (me->roce) {
        if (memcmp(tq->dgid, me->sgid, 16) || memcmp(me->dgid, tq->sgid, 16) || tq->sgid_type != me->sgid_type)
            return 0;
    } else if (tq->dlid != me->own_lid) {
        return 0;
    }
    return 1;
}

static void count_op(int opcode, uint64_t len)
{
    switch (opcode) {
    case IBV_WR_SEND: STAT_ADD(send, 1); break;
    case IBV_WR_SEND_WITH_IMM: STAT_ADD(send_imm, 1); break;
    case IBV_WR_RDMA_WRITE: STAT_ADD(write, 1); break;
    case IBV_WR_RDMA_WRITE_WITH_IMM: STAT_ADD(write_imm, 1); break;
    case IBV_WR_RDMA_READ: STAT_ADD(read, 1); break;
    default: break;
    }
    if (opcode == IBV_WR_RDMA_READ)
        STAT_ADD(bytes_in, len);
    else
        STAT_ADD(bytes_out, len);
}

static int exec_wr(struct emu_qp *q, struct swr *w, enum ibv_wc_status *st)
{
    uint64_t now;
    *st = IBV_WC_SUCCESS;
    if (w->drop == 2)
        do_drop();
    if (w->fault) {
        *st = (enum ibv_wc_status)g.fail_status;
        return X_DONE;
    }
    if (w->len > g.max_msg) {
        *st = IBV_WC_LOC_LEN_ERR;
        return X_DONE;
    }
    struct iovec liov[EMU_MAX_SGE];
    int nl;
    if (check_local(q, w, w->opcode == IBV_WR_RDMA_READ, liov, &nl)) {
        *st = IBV_WC_LOC_PROT_ERR;
        return X_DONE;
    }
    /* a snapshot of our connection attributes */
    struct shm_qp me;
    seg_lock(&g.self);
    me = *seg_qp(&g.self, q->slot);
    seg_unlock(&g.self);

    pid_t tpid;
    int tdev;
    if (me.roce) {
        if (gid_owner(me.dgid, &tpid, &tdev) != 0)
            tpid = 0;
    } else {
        tdev = (me.dlid - 1) >> 14;
        tpid = (pid_t)(((me.dest_qpn >> 16) << 14) | ((me.dlid - 1u) & 0x3FFFu));
    }
    uint32_t tslot = (me.dest_qpn & 0xFFFF) - 2;
    struct seg *t = (tpid > 0 && tslot < EMU_MAX_QPS && !__atomic_load_n(&g.dropped, __ATOMIC_ACQUIRE))
                        ? get_seg(tpid)
                        : NULL;
    int unreachable = 1, rnr = 0, terr = 0;
    uint32_t rnr_timer = 0;
    if (!t || !peer_alive(t))
        goto unreach;
    seg_lock(t);
    struct shm_qp *tq = seg_qp(t, tslot);
    if (!connected(&me, tq, me.dest_qpn, tdev)) {
        seg_unlock(t);
        goto unreach;
    }
    /* a packet larger than the responder's path MTU is dropped */
    if (w->len > mtu_bytes(tq->path_mtu) && tq->path_mtu < me.path_mtu) {
        seg_unlock(t);
        goto unreach;
    }
    unreachable = 0;
    rnr_timer = tq->min_rnr_timer;
    struct emu_cqe rcqe;
    memset(&rcqe, 0, sizeof rcqe);
    int push_recv = 0;
    switch (w->opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM: {
        void *rwhere = (void *)(uintptr_t)w->raddr;
        if (w->len && check_rkey(t, tq, w->rkey, w->raddr, w->len, IBV_ACCESS_REMOTE_WRITE, &rwhere)) {
            qp_to_error_locked(t, tslot);
            *st = IBV_WC_REM_ACCESS_ERR;
            break;
        }
        if (w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM && tq->rq_head == tq->rq_tail) {
            rnr = 1;
            break;
        }
        struct iovec riov = { rwhere, w->len };
        if (w->len && cma(t->pid, liov, nl, &riov, 1, w->len, 1)) {
            terr = 1;
            break;
        }
        if (w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
            struct shm_rwr *r = rq_entry(t, tq, tq->rq_head);
            tq->rq_head++;
            rcqe.wc.wr_id = r->wr_id;
            rcqe.wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
            rcqe.wc.wc_flags = IBV_WC_WITH_IMM;
            rcqe.wc.imm_data = w->imm;
            push_recv = 1;
        }
        break;
    }
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM: {
        if (tq->rq_head == tq->rq_tail) {
            rnr = 1;
            break;
        }
        struct shm_rwr *r = rq_entry(t, tq, tq->rq_head);
        uint64_t room = 0;
        int bad = 0;
        struct iovec riov[EMU_MAX_SGE];
        int nr = 0;
        for (uint32_t i = 0; i < r->num_sge; i++) {
            const struct ibv_sge *s = &r->sg[i];
            room += s->length;
            if (!s->length)
                continue;
            uint32_t slot = s->lkey >> 8;
            const struct shm_mr *m = slot < EMU_MAX_MRS ? seg_mr(t, slot) : NULL;
            if (!m || !m->in_use || m->key != s->lkey || m->pd_id != tq->pd_id || s->addr < m->addr ||
                s->addr + s->length > m->addr + m->length || !(m->access & IBV_ACCESS_LOCAL_WRITE))
                bad = 1;
            riov[nr].iov_base = bad ? (void *)(uintptr_t)s->addr : mr_where(m, s->addr);
            riov[nr].iov_len = s->length;
            nr++;
        }
        enum ibv_wc_status rst = IBV_WC_SUCCESS;
        if (room < w->len) {
            rst = IBV_WC_LOC_LEN_ERR;
            *st = IBV_WC_REM_INV_REQ_ERR;
        } else if (bad) {
            rst = IBV_WC_LOC_PROT_ERR;
            *st = IBV_WC_REM_OP_ERR;
        }
        if (rst != IBV_WC_SUCCESS) {
            struct emu_cqe e;
            memset(&e, 0, sizeof e);
            fill_err_wc(&e.wc, r->wr_id, rst, tq->qpn, 1);
            tq->rq_head++;
            cq_push_locked(t, tq->recv_cq, &e);
            qp_to_error_locked(t, tslot);
            break;
        }
        if (w->len && cma(t->pid, liov, nl, riov, nr, w->len, 1)) {
            terr = 1;
            break;
        }
        tq->rq_head++;
        rcqe.wc.wr_id = r->wr_id;
        rcqe.wc.opcode = IBV_WC_RECV;
        if (w->opcode == IBV_WR_SEND_WITH_IMM) {
            rcqe.wc.wc_flags = IBV_WC_WITH_IMM;
            rcqe.wc.imm_data = w->imm;
        }
        push_recv = 1;
        break;
    }
    case IBV_WR_RDMA_READ: {
        if (me.max_rd == 0 || tq->max_dest_rd == 0) {
            *st = IBV_WC_REM_INV_REQ_ERR;
            break;
        }
        void *rwhere = (void *)(uintptr_t)w->raddr;
        if (w->len && check_rkey(t, tq, w->rkey, w->raddr, w->len, IBV_ACCESS_REMOTE_READ, &rwhere)) {
            qp_to_error_locked(t, tslot);
            *st = IBV_WC_REM_ACCESS_ERR;
            break;
        }
        struct iovec riov = { rwhere, w->len };
        if (w->len && cma(t->pid, liov, nl, &riov, 1, w->len, 0))
            terr = 1;
        break;
    }
    default:
        *st = IBV_WC_LOC_QP_OP_ERR;
        break;
    }
    if (push_recv) {
        rcqe.wc.status = IBV_WC_SUCCESS;
        rcqe.wc.byte_len = (uint32_t)w->len;
        rcqe.wc.qp_num = tq->qpn;
        rcqe.wc.src_qp = me.qpn;
        rcqe.wc.slid = me.roce ? 0 : me.own_lid;
        cq_push_locked(t, tq->recv_cq, &rcqe);
    }
    seg_unlock(t);
    if (terr) /* the peer's memory is gone: it died */
        goto unreach;
    if (rnr) {
        now = now_ns();
        if (!w->rnr_counted) {
            w->rnr_counted = 1;
            STAT_ADD(rnr_waits, 1);
        }
        if (q->rnr_retry == 7)
            return X_WAIT;
        if (!w->t_rnr)
            w->t_rnr = now;
        uint64_t lim = rnr_delay_ns(rnr_timer) * q->rnr_retry;
        if (lim > EMU_RETRY_CAP_NS)
            lim = EMU_RETRY_CAP_NS;
        if (now - w->t_rnr >= lim) {
            *st = IBV_WC_RNR_RETRY_EXC_ERR;
            return X_DONE;
        }
        return X_WAIT;
    }
    if (*st == IBV_WC_SUCCESS)
        count_op(w->opcode, w->len);
    if (w->drop == 1)
        do_drop();
    return X_DONE;
unreach:
    (void)unreachable;
    now = now_ns();
    if (!w->t_first) {
        w->t_first = now;
        STAT_ADD(retry_waits, 1);
    }
    if (now - w->t_first >= retry_ns(q)) {
        *st = IBV_WC_RETRY_EXC_ERR;
        return X_DONE;
    }
    return X_WAIT;
}

static void push_send_cqe(struct emu_qp *q, const struct swr *w, uint64_t seq, enum ibv_wc_status st)
{
    struct emu_cqe e;
    memset(&e, 0, sizeof e);
    if (st != IBV_WC_SUCCESS) {
        fill_err_wc(&e.wc, w->wr_id, st, q->qp.qp_num, 0);
    } else {
        e.wc.wr_id = w->wr_id;
        e.wc.status = IBV_WC_SUCCESS;
        switch (w->opcode) {
        case IBV_WR_SEND:
        case IBV_WR_SEND_WITH_IMM: e.wc.opcode = IBV_WC_SEND; break;
        case IBV_WR_RDMA_READ: e.wc.opcode = IBV_WC_RDMA_READ; break;
        default: e.wc.opcode = IBV_WC_RDMA_WRITE; break;
        }
        e.wc.byte_len = (uint32_t)w->len;
        e.wc.qp_num = q->qp.qp_num;
    }
    e.is_send = 1;
    e.qp_slot = q->slot;
    e.qp_gen = q->gen;
    e.sq_seq = seq;
    seg_lock(&g.self);
    cq_push_locked(&g.self, q->scq->slot, &e);
    seg_unlock(&g.self);
}

static void progress_qp(struct emu_qp *q)
{
    while (q->sq_exec < q->sq_tail) {
        uint32_t st = qp_state(q->slot);
        struct swr *w = &q->sq[q->sq_exec % q->sq_cap];
        if (st == IBV_QPS_ERR) {
            STAT_ADD(flushes, 1);
            push_send_cqe(q, w, q->sq_exec, IBV_WC_WR_FLUSH_ERR);
            q->sq_exec++;
            continue;
        }
        if (st != IBV_QPS_RTS)
            return;
        enum ibv_wc_status status;
        if (exec_wr(q, w, &status) == X_WAIT)
            return;
        uint64_t seq = q->sq_exec++;
        if (status != IBV_WC_SUCCESS) {
            STAT_ADD(errors, 1);
            /* the error completion first, then the flushes it causes */
            push_send_cqe(q, w, seq, status);
            seg_lock(&g.self);
            qp_to_error_locked(&g.self, q->slot);
            seg_unlock(&g.self);
        } else if (w->signaled) {
            push_send_cqe(q, w, seq, IBV_WC_SUCCESS);
        }
    }
}

static int emu_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    struct emu_cq *c = (struct emu_cq *)cq;
    struct emu_context *ec = (struct emu_context *)cq->context;
    if (n < 0)
        return -1;
    pthread_mutex_lock(&ec->lock);
    for (struct emu_qp *q = ec->qps; q; q = q->next)
        progress_qp(q);
    struct emu_cqe tmp[64];
    int got = 0, rc = 0;
    while (got < n) {
        int want = n - got < 64 ? n - got : 64, k = 0;
        seg_lock(&g.self);
        struct shm_cq *sc = seg_cq(&g.self, c->slot);
        if (sc->broken) {
            seg_unlock(&g.self);
            rc = -1;
            break;
        }
        struct emu_cqe *ring = seg_heap(&g.self, sc->ring_off);
        while (k < want && sc->head != sc->tail) {
            tmp[k++] = ring[sc->head % sc->cap];
            sc->head++;
        }
        seg_unlock(&g.self);
        for (int i = 0; i < k; i++) {
            wc[got + i] = tmp[i].wc;
            if (tmp[i].is_send) {
                struct emu_qp *q = g.qp_by_slot[tmp[i].qp_slot];
                if (q && q->gen == tmp[i].qp_gen && tmp[i].sq_seq + 1 > q->sq_head && tmp[i].sq_seq < q->sq_tail)
                    q->sq_head = tmp[i].sq_seq + 1;
            }
        }
        got += k;
        if (k < want)
            break;
    }
    pthread_mutex_unlock(&ec->lock);
    return rc ? rc : got;
}

/* ---- misc -------------------------------------------------------------------- */
EXPORT const char *ibv_wc_status_str(enum ibv_wc_status status)
{
    static const char *const str[] = {
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
        [IBV_WC_TM_ERR] = "TM error",
        [IBV_WC_TM_RNDV_INCOMPLETE] = "TM software rendezvous",
    };
    if ((unsigned)status < sizeof str / sizeof str[0] && str[status])
        return str[status];
    return "unknown";
}
