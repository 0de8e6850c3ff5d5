/*
 * One weft comm per MPI communicator, made at the communicator's first
 * intercepted call and cached on it as an attribute.
 *
 * Made lazily because only the collectives the program really calls on a
 * communicator should cost a weft set-up, and because every rank of the
 * communicator reaches that first call together (it is a collective that
 * every rank routes alike), which weft_comm_create needs.
 *
 * Freed by the attribute's delete callback: MPI runs it inside
 * MPI_Comm_free (collective, so weft_comm_destroy -- also collective --
 * has every rank) and MPI_Comm_dup does not copy the attribute
 * (MPI_COMM_NULL_COPY_FN): a duplicate gets its own weft comm when first
 * used. MPI_COMM_WORLD and communicators never freed are released at
 * MPI_Finalize: MPI deletes MPI_COMM_SELF's attributes first thing there,
 * while MPI still works, and the callback of an attribute this layer put on
 * MPI_COMM_SELF destroys every weft comm still alive, in the order they
 * were made (the order their collectives ran in, so the ranks of each
 * destroy meet), then prints the WEFT_MPI_STATS line.
 *
 * A weft comm that cannot be made on some rank (a transport failing to set
 * up, no memory) must not leave the others on weft: the ranks agree (one
 * PMPI_Allreduce) and all fall back to PMPI for that communicator, the
 * ranks that did make one dropping it locally (weft_comm_abort, so destroy
 * waits for no one), with one WARN line where it failed.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "weft_mpi.h"

struct entry {
    weft_comm_t  *weft;        /* NULL: this communicator goes to PMPI */
    MPI_Comm      mpi;         /* the program's handle */
    int           nranks, rank;
    size_t        node_bytes;  /* weft_comm_node_coll_bytes at creation (route.c) */
    unsigned long seq;         /* creation order */
    struct entry *prev, *next; /* live entries, oldest first */
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
/* 0: not set up yet; 1: serving; 2: not serving (set-up failed, or
 * MPI_Finalize began). Read on every intercepted call, so a served call
 * pays one load for it instead of two MPI queries. */
static atomic_int state;
static int comm_key = MPI_KEYVAL_INVALID;  /* the entry on each communicator */
static int self_key = MPI_KEYVAL_INVALID;  /* MPI_COMM_SELF: MPI_Finalize's hook */
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry *oldest, *newest;
static unsigned long next_seq;

void wmpi_warn(const char *fmt, ...)
{
    char line[1024];
    int rank = -1, init = 0, fin = 0, n;
    va_list ap;

    PMPI_Initialized(&init);
    PMPI_Finalized(&fin);
    if (init && !fin)
        PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    n = snprintf(line, sizeof(line), "weft_mpi[rank %d] WARN: ", rank);
    va_start(ap, fmt);
    if (n > 0)
        vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);   /* one write per line: ranks' lines do not interleave */
}

/* While weft waits inside an intercepted call, MPI must still move the
 * program's own messages: Open MPI over TCP progresses only inside MPI
 * calls, and a legal `MPI_Isend; MPI_Barrier; MPI_Wait` against
 * `MPI_Recv; MPI_Barrier` needs the Isend to move while this rank sits in
 * the barrier. A probe is MPI's cheapest call that runs its progress. */
static void mpi_progress(void *arg)
{
    MPI_Comm comm = *(MPI_Comm *)arg;
    int flag = 0;
    PMPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, MPI_STATUS_IGNORE);
}

static void unlink_entry(struct entry *e)
{
    pthread_mutex_lock(&reg_lock);
    if (e->prev)
        e->prev->next = e->next;
    else if (oldest == e)
        oldest = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else if (newest == e)
        newest = e->prev;
    e->prev = e->next = NULL;
    pthread_mutex_unlock(&reg_lock);
}

static void release(struct entry *e)
{
    if (e->weft) {
        int rc = weft_comm_destroy(e->weft);
        /* Aborted (a fallback, or after a failure): destroy says so; not news. */
        if (rc != WEFT_SUCCESS && rc != WEFT_ERR_ABORTED)
            wmpi_warn("weft_comm_destroy of the comm serving an MPI communicator failed: %s (%s)",
                      weft_last_error(), weft_strerror(rc));
    }
    free(e);
}

/* Bumped whenever an entry goes (its communicator freed): a handle value
 * MPI reuses for a new communicator then no longer matches a caller's
 * cached answer (colls.c, route). */
static atomic_ulong entry_gen = 1;

unsigned long wmpi_comm_gen(void)
{
    return atomic_load_explicit(&entry_gen, memory_order_acquire);
}

/* MPI_Comm_free (or MPI_Finalize, below) of a communicator with an entry. */
static int comm_delete(MPI_Comm comm, int key, void *value, void *extra)
{
    struct entry *e = value;
    (void)comm;
    (void)key;
    (void)extra;
    atomic_fetch_add_explicit(&entry_gen, 1, memory_order_acq_rel);
    unlink_entry(e);
    release(e);
    return MPI_SUCCESS;
}

/* MPI_Finalize: every weft comm still alive, oldest first. */
static int self_delete(MPI_Comm comm, int key, void *value, void *extra)
{
    (void)comm;
    (void)key;
    (void)value;
    (void)extra;
    atomic_store(&state, 2);   /* from here on every call goes to PMPI */
    for (;;) {
        pthread_mutex_lock(&reg_lock);
        struct entry *e = oldest;
        pthread_mutex_unlock(&reg_lock);
        if (e == NULL)
            break;
        /* Runs comm_delete, which unlinks and releases e; if MPI refuses
         * (the communicator is already being freed), release it here. */
        if (PMPI_Comm_delete_attr(e->mpi, comm_key) != MPI_SUCCESS) {
            unlink_entry(e);
            release(e);
        }
    }
    wmpi_stats_print();
    return MPI_SUCCESS;
}

/* The MPI family this library was compiled against (mpi.h's macros), and
 * whether the running program's MPI is another one. The two families'
 * ABIs differ: Open MPI's handles are pointers, MPICH's are ints, so the
 * arguments of an intercepted call already arrive mangled (a 64-bit
 * MPI_Datatype read as a 32-bit one), and nothing the call does -- not even
 * passing them on to PMPI -- is sound. Without this check the first call
 * fails deep in MPI ("Invalid communicator", MPI_ERR_ARG) or crashes.
 * So the library asks the running MPI its name, through the one call whose
 * arguments are plain C types, before it touches anything else, and ends
 * the process with the reason if it is the wrong library. */
#if defined(OPEN_MPI)
#define WMPI_BUILT_FOR "Open MPI"
#elif defined(MPICH_VERSION)
#define WMPI_BUILT_FOR "MPICH"
#endif

static void refuse_foreign_mpi(void)
{
#ifdef WMPI_BUILT_FOR
    /* Larger than any family's MPI_MAX_LIBRARY_VERSION_STRING (MPICH:
     * 8192, Open MPI: 256): the running MPI writes up to its own. */
    static char version[16384];
    int len = 0;

    if (PMPI_Get_library_version(version, &len) != MPI_SUCCESS)
        return;
    version[sizeof(version) - 1] = '\0';
    const int open_mpi = strstr(version, "Open MPI") != NULL;
#if defined(OPEN_MPI)
    const int foreign = !open_mpi && (strstr(version, "MPICH") != NULL || strstr(version, "MVAPICH") != NULL ||
                                      strstr(version, "Intel(R) MPI") != NULL);
#else
    const int foreign = open_mpi;
#endif
    if (!foreign)
        return;
    /* wmpi_warn would ask MPI_COMM_WORLD for the rank: the launchers'
     * variables name it instead. */
    const char *rank = getenv("PMI_RANK");
    if (rank == NULL)
        rank = getenv("OMPI_COMM_WORLD_RANK");
    char *nl = strchr(version, '\n');
    if (nl != NULL)
        *nl = '\0';
    fprintf(stderr,
            "weft_mpi[rank %s] ERROR: this libweft_mpi.so was built against %s, but the program runs \"%.100s\": "
            "the two MPIs' handles differ (pointers vs ints), so no call can go through this library; exiting. "
            "Preload the libweft_mpi.so built against the program's MPI (cmake -DWEFT_MPI_IMPL=%s; docs/mpi.md)\n",
            rank != NULL ? rank : "?", WMPI_BUILT_FOR, version, open_mpi ? "OPENMPI" : "MPICH");
    _exit(1);
#endif
}

static void setup(void)
{
    refuse_foreign_mpi();
    wmpi_settings_load();
    wmpi_types_init();
    if (PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, comm_delete, &comm_key, NULL) != MPI_SUCCESS ||
        PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, self_delete, &self_key, NULL) != MPI_SUCCESS ||
        PMPI_Comm_set_attr(MPI_COMM_SELF, self_key, NULL) != MPI_SUCCESS) {
        wmpi_warn("cannot create the MPI attribute keys the weft layer needs; every call goes to MPI");
        atomic_store(&state, 2);
        return;
    }
    if (wmpi_errors_init() != MPI_SUCCESS) {
        wmpi_warn("cannot create weft's MPI error class; every call goes to MPI");
        atomic_store(&state, 2);
        return;
    }
    atomic_store(&state, 1);
}

int wmpi_ready(void)
{
    int s = atomic_load_explicit(&state, memory_order_acquire), init = 0, fin = 0;

    if (s != 0)
        return s == 1;
    PMPI_Initialized(&init);
    PMPI_Finalized(&fin);
    if (!init || fin)
        return 0;
    pthread_once(&once, setup);
    return atomic_load(&state) == 1;
}

/* The weft comms' configuration: WEFT_THREADS=serialized when MPI runs
 * below MPI_THREAD_MULTIPLE -- the program then calls MPI, and so this
 * layer and weft, from one thread at a time, which is the promise that
 * setting asks for (docs/api.md; the comm takes no lock) -- unless the
 * user set WEFT_THREADS. NULL (the environment alone) otherwise. */
static const weft_config_t *serialized_config(void)
{
    static const weft_setting_t serialized = {"WEFT_THREADS", "serialized"};
    static const weft_config_t cfg = {sizeof(weft_config_t), WEFT_CONFIG_MAGIC, WEFT_CONFIG_VERSION, &serialized, 1};
    int level = MPI_THREAD_MULTIPLE;
    if (getenv("WEFT_THREADS") != NULL || PMPI_Query_thread(&level) != MPI_SUCCESS || level >= MPI_THREAD_MULTIPLE)
        return NULL;
    return &cfg;
}

/* Makes the weft comm of comm (every rank of comm is here). */
static struct entry *make(MPI_Comm comm)
{
    struct entry *e = calloc(1, sizeof(*e));
    weft_comm_t *wc = NULL;
    int rc = WEFT_ERR_NO_MEMORY, ok, all_ok = 0;
    const char *why = "no memory for the communicator's entry";

    if (e != NULL) {
        rc = weft_comm_create_config(comm, serialized_config(), &wc);
        why = weft_last_error();
    }
    ok = e != NULL && rc == WEFT_SUCCESS;
    if (PMPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS)
        all_ok = 0;
    if (!ok) {
        int size = -1;
        PMPI_Comm_size(comm, &size);
        wmpi_warn("weft cannot serve a communicator of %d ranks: %s (%s); its collectives go to MPI", size, why,
                  weft_strerror(rc));
    }
    if (ok && !all_ok) {
        /* Another rank could not: drop ours without waiting for anyone. */
        weft_comm_abort(wc);
        weft_comm_destroy(wc);
        wc = NULL;
    }
    if (e == NULL)
        return NULL;
    e->weft = all_ok ? wc : NULL;
    e->mpi = comm;
    PMPI_Comm_size(comm, &e->nranks);
    PMPI_Comm_rank(comm, &e->rank);
    /* Read once: the same on every rank now, and kept so (a segment that
     * later cannot be made sends weft's own calls to messages, while the
     * routing here stays as it was on every rank). */
    if (e->weft && weft_comm_node_coll_bytes(e->weft, &e->node_bytes) != WEFT_SUCCESS)
        e->node_bytes = 0;
    if (e->weft)
        weft_comm_set_wait_hook(e->weft, mpi_progress, &e->mpi);
    if (PMPI_Comm_set_attr(comm, comm_key, e) != MPI_SUCCESS) {
        release(e);
        return NULL;
    }
    pthread_mutex_lock(&reg_lock);
    e->seq = next_seq++;
    e->prev = newest;
    if (newest)
        newest->next = e;
    else
        oldest = e;
    newest = e;
    pthread_mutex_unlock(&reg_lock);
    return e;
}

/* Each thread's last lookup: the communicator, its entry, and the
 * generation it was found in. Programs call collectives on one
 * communicator over and over; the attribute lookup costs ~25 ns of a
 * 0.3 us call. An entry lives until its communicator is freed, which bumps
 * entry_gen, so a handle MPI reuses never finds a stale entry here. */
/* initial-exec: no __tls_get_addr call per lookup (the library is
 * preloaded or linked, so its few bytes come from the static TLS block). */
static _Thread_local __attribute__((tls_model("initial-exec"))) struct {
    MPI_Comm      comm;
    struct entry *e;
    unsigned long gen;
} last;

static struct entry *lookup(MPI_Comm comm)
{
    struct entry *e = NULL;
    int found = 0, inter = 0, size = 0;
    unsigned long gen = wmpi_comm_gen();

    if (last.e != NULL && last.comm == comm && last.gen == gen)
        return last.e;
    if (comm == MPI_COMM_NULL || !wmpi_ready())
        return NULL;
    if (PMPI_Comm_get_attr(comm, comm_key, &e, &found) != MPI_SUCCESS)
        return NULL;
    if (!found) {
        /* Agreed by every rank of comm: an intercommunicator or a single
         * rank stays with MPI (weft's comms are intra, and one rank needs
         * no pipes). */
        if (PMPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS || inter)
            return NULL;
        if (PMPI_Comm_size(comm, &size) != MPI_SUCCESS || size < 2)
            return NULL;
        e = make(comm);
    }
    if (e != NULL) {
        last.comm = comm;
        last.e = e;
        last.gen = gen;
    }
    return e;
}

int wmpi_comm_info(MPI_Comm comm, struct wmpi_comm_info *info)
{
    struct entry *e = lookup(comm);
    if (e == NULL)
        return 0;
    info->weft = e->weft;
    info->nranks = e->nranks;
    info->rank = e->rank;
    info->node_bytes = e->node_bytes;
    return 1;
}
