/*
 * Partial failures while a comm is being made (issue 12): a rank that dies
 * or stops in the middle of weft_comm_init (the unique-id bootstrap) or of
 * weft_comm_split. The survivors must fail within WEFT_TIMEOUT (+ a margin),
 * with an error that names the missing rank (or, when the process holding
 * the id's root is gone, the root's address).
 *
 *   weft_mpi_create_faults <case>         (np 4; or WEFT_CREATE_FAULT_CASE)
 *
 * Unique id (rank 0 makes the id, MPI_Bcast hands it over; victim rank 2):
 *   uid_absent         the victim exits instead of calling weft_comm_init
 *   uid_join_exit      the victim joins (its hello is sent) and exits while
 *                      waiting for the others; rank 3 comes 1 s later
 *   uid_mid_exit       the victim exits in the middle of the set-up, after the
 *                      meeting and the settings' agreement (its
 *                      gethostname, below)
 *   uid_mid_stop       the same point, but it stops itself (SIGSTOP)
 *   uid_mid_sleep      the same point, but it sleeps past WEFT_TIMEOUT
 *   uid_prep_exit      the victim exits while its shm transport makes its
 *                      segment (its first shm_open), after the cards were
 *                      exchanged: the others are in the next exchange (an
 *                      allgather that carries their codes), which the root
 *                      fails, and then in the agreement on that failure,
 *                      which reaches a root that has closed: they must
 *                      still name the victim, not "lost the root"
 *   uid_root_exit      rank 0, whose process holds the root, exits once the
 *                      others are connected, without joining
 *   uid_root_mid_exit  rank 0 joins and exits in the middle of the set-up
 * Split (parent: weft_comm_create on MPI_COMM_WORLD; one color; victim rank 2):
 *   split_exit         the victim exits right before weft_comm_split
 *   split_stop         the victim stops itself (SIGSTOP) instead of calling it
 *   split_mid_exit     the victim exits inside the split, after the parent's
 *                      allgather and the new comm's settings agreement
 *   split_mid_exit_late  the same, but the survivors pause 0.5 s at that point
 *                      (their gethostname), rank 0 running the parent's
 *                      progress meanwhile (weft_test on a receive from self):
 *                      its pipe to the victim broke before the next exchange
 *                      starts, the others' did not know yet
 *   split_mid_stop     the same point, but it stops itself
 *   split_mid_sleep    the same point, but it sleeps past WEFT_TIMEOUT
 * A stopped victim is SIGKILLed by the first survivor at the end; a
 * sleeping one exits after WEFT_TIMEOUT + 4 s. (No case where a member
 * sleeps instead of calling weft_comm_split: the parent's allgather then
 * blames whichever rank a survivor waited on, a live survivor waiting for
 * the victim included, since that one is as alive and silent as the
 * victim; a stopped victim is told apart by its process state.)
 *
 * The "mid" cases need a point inside creation that every run reaches in
 * the same state. comm.c asks for the host name (gethostname) once per
 * creation, after the bootstrap is up and the WEFT_* settings were agreed,
 * just before the rank cards are exchanged: this binary exports its own
 * gethostname (ENABLE_EXPORTS), which libweft's call binds to, and when
 * armed and called from libweft it ends or stalls the process there. The
 * same way, uid_join_exit arms a recv hook: the first recv libweft makes
 * in weft_comm_init is the wait for the root's welcome, right after the
 * hello went out. Calls from anywhere else (MPI) pass straight through.
 *
 * Each survivor checks: the call fails with an expected code (per case),
 * *comm untouched; weft_last_error() names the victim ("rank 2") and no
 * other rank as the failed one (besides its own "rank N:" prefix), or for
 * the root cases the root's address; the elapsed time is within the case's
 * bound (WEFT_TIMEOUT + 2 s for a stall; less than WEFT_TIMEOUT for a death,
 * which the sockets show at once, where the design promises that; split
 * deaths are bounded by WEFT_TIMEOUT + 2 s, the pipes may only learn of
 * them by their clock). After a failed split the parent's last error must
 * say weft_comm_split and name the victim too, and the parent is destroyed,
 * which must return within WEFT_TIMEOUT + 2 s (any code; not after a
 * sleeping victim: see run_split). Each survivor prints
 * "CREATE-FAULT-OK rank N ..." or "CREATE-FAULT-FAIL rank N ..."; then the
 * first survivor gathers the verdicts over the survivors' own MPI
 * communicator (split off before the fault) and prints
 * "CREATE-FAULTS-PASSED <case>" when all of them passed. Everyone _exits:
 * MPI_Finalize would wait for the dead rank.
 *
 * mpirun needs --mca orte_enable_recovery 1 --mca orte_abort_on_non_zero_status 0
 * so the survivors outlive the victim (create_faults.cmake).
 */
#include <mpi.h>

#include <dlfcn.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "weft.h"

namespace {

double now_s()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Run {
    std::string kase;
    int rank = -1, size = 0, victim = 2;
    double timeout = 3;   /* WEFT_TIMEOUT */
};
Run g_run;

/* ---- the hooks ---- */

enum Hook {
    HOOK_NONE = 0,
    HOOK_EXIT_AT_RECV,
    HOOK_EXIT_AT_HOSTNAME,
    HOOK_STOP_AT_HOSTNAME,
    HOOK_SLEEP_AT_HOSTNAME,
    HOOK_DELAY_AT_HOSTNAME,   /* a survivor: 0.5 s there, then on */
    HOOK_EXIT_AT_SHM_OPEN,
};
std::atomic<int> g_hook{HOOK_NONE};

/* split_mid_exit_late: a receive from self on the parent, which the delay
 * hook tests to run the parent's progress (weft moves only inside calls). */
weft_request_t *g_self_req = nullptr;

/* Whether the code at addr lies in libweft (not MPI, not libc). */
bool from_libweft(const void *addr)
{
    Dl_info info;
    return dladdr(addr, &info) != 0 && info.dli_fname != nullptr && std::strstr(info.dli_fname, "libweft") != nullptr;
}

[[noreturn]] void victim_ends(const char *where)
{
    std::printf("VICTIM rank %d %s: %s\n", g_run.rank, g_run.kase.c_str(), where);
    std::fflush(stdout);
    _exit(0);
}

/* stop: SIGSTOP (state T: frozen, as under a debugger; a survivor SIGKILLs
 * it at the end). sleep: alive and runnable (state S) but not calling weft
 * for WEFT_TIMEOUT + 4 s, then it exits. */
[[noreturn]] void victim_stalls(bool stop, const char *where)
{
    std::printf("VICTIM rank %d %s: %s %s\n", g_run.rank, g_run.kase.c_str(), stop ? "stops itself" : "sleeps",
                where);
    std::fflush(stdout);
    if (stop) {
        raise(SIGSTOP);
        for (;;)
            pause();   /* stopped, then killed */
    }
    usleep((useconds_t)((g_run.timeout + 4) * 1e6));
    victim_ends("woke up, exits");
}

void victim_hook(int armed_for, const char *where)
{
    int h = armed_for;
    if (!g_hook.compare_exchange_strong(h, HOOK_NONE))
        return;
    if (armed_for == HOOK_DELAY_AT_HOSTNAME) {
        /* Rank 0 runs the parent's progress meanwhile, as a rank whose
         * previous exchange was still running would: its pipe to the
         * victim sees the death before the next exchange starts, while
         * the others' pipes do not know yet. */
        const double until = now_s() + 0.5;
        while (now_s() < until) {
            int done = 0;
            weft_status_t st;
            if (g_self_req != nullptr)
                (void)weft_test(g_self_req, &done, &st);
            usleep(5000);
        }
        return;
    }
    if (armed_for == HOOK_STOP_AT_HOSTNAME || armed_for == HOOK_SLEEP_AT_HOSTNAME)
        victim_stalls(armed_for == HOOK_STOP_AT_HOSTNAME, where);
    victim_ends(where);
}

} // namespace

/* The interposers, under their libc names (an asm label, so the C++ names
 * do not collide with the headers' declarations). */
extern "C" int create_faults_gethostname(char *name, size_t len) __asm__("gethostname");
extern "C" ssize_t create_faults_recv(int fd, void *buf, size_t n, int flags) __asm__("recv");
extern "C" int create_faults_shm_open(const char *name, int oflag, mode_t mode) __asm__("shm_open");

extern "C" int create_faults_shm_open(const char *name, int oflag, mode_t mode)
{
    static int (*real)(const char *, int, mode_t) = nullptr;
    if (g_hook.load() == HOOK_EXIT_AT_SHM_OPEN && from_libweft(__builtin_return_address(0)))
        victim_hook(HOOK_EXIT_AT_SHM_OPEN, "in weft's shm_open (its shm transport's segment)");
    if (real == nullptr)
        real = reinterpret_cast<int (*)(const char *, int, mode_t)>(dlsym(RTLD_NEXT, "shm_open"));
    return real(name, oflag, mode);
}

extern "C" int create_faults_gethostname(char *name, size_t len)
{
    static int (*real)(char *, size_t) = nullptr;
    const int h = g_hook.load();
    if (h >= HOOK_EXIT_AT_HOSTNAME && h <= HOOK_DELAY_AT_HOSTNAME && from_libweft(__builtin_return_address(0)))
        victim_hook(h, "in weft's gethostname (mid-creation)");
    if (real == nullptr)
        real = reinterpret_cast<int (*)(char *, size_t)>(dlsym(RTLD_NEXT, "gethostname"));
    return real(name, len);
}

extern "C" ssize_t create_faults_recv(int fd, void *buf, size_t n, int flags)
{
    static ssize_t (*real)(int, void *, size_t, int) = nullptr;
    if (g_hook.load() == HOOK_EXIT_AT_RECV && from_libweft(__builtin_return_address(0)))
        victim_hook(HOOK_EXIT_AT_RECV, "after its hello, waiting for the welcome");
    if (real == nullptr)
        real = reinterpret_cast<ssize_t (*)(int, void *, size_t, int)>(dlsym(RTLD_NEXT, "recv"));
    return real(fd, buf, n, flags);
}

namespace {

/* What the survivor saw so far, for a FAIL line that a hang cuts short. */
std::string g_so_far;

/* Every rank's pid (MPI_Allgather at start). */
std::vector<int> g_pids;

std::string read_first_line(const std::string &path)
{
    std::ifstream f(path);
    std::string line;
    std::getline(f, line);
    return line;
}

/* SIGKILLs a victim that stopped itself, so mpirun can finish; only while
 * its pid is still this program (same /proc/<pid>/comm): never a pid that
 * could have been reused. */
void kill_stopped_victim()
{
    if (g_run.kase.find("_stop") == std::string::npos || g_run.rank == g_run.victim ||
        (int)g_pids.size() <= g_run.victim)
        return;
    const pid_t pid = (pid_t)g_pids[(size_t)g_run.victim];
    const std::string theirs = read_first_line("/proc/" + std::to_string(pid) + "/comm");
    if (!theirs.empty() && theirs == read_first_line("/proc/self/comm"))
        kill(pid, SIGKILL);
}

/* Prints a survivor's failure line and ends it (a call that hung). */
[[noreturn]] void fail_now(const std::string &detail)
{
    kill_stopped_victim();
    std::printf("CREATE-FAULT-FAIL rank %d %s: %s%s%s\n", g_run.rank, g_run.kase.c_str(), detail.c_str(),
                g_so_far.empty() ? "" : " | before that: ", g_so_far.c_str());
    std::fflush(stdout);
    _exit(1);
}

/* A call that does not return in time ends the survivor with a FAIL line. */
class Watchdog {
public:
    Watchdog(double seconds, std::string what) : what_(std::move(what))
    {
        thread_ = std::thread([this, seconds] {
            std::unique_lock<std::mutex> lk(mu_);
            if (!cv_.wait_for(lk, std::chrono::duration<double>(seconds), [this] { return done_; })) {
                char buf[64];
                std::snprintf(buf, sizeof buf, " did not return within %.1f s", seconds);
                fail_now(what_ + buf);
            }
        });
    }
    ~Watchdog()
    {
        {
            std::lock_guard<std::mutex> lk(mu_);
            done_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    Watchdog(const Watchdog &) = delete;
    Watchdog &operator=(const Watchdog &) = delete;

private:
    std::string what_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool done_ = false;
    std::thread thread_;
};

/* What a case expects of the survivors. */
struct Expect {
    std::vector<int> codes;      /* any of these */
    std::string text;            /* must appear in weft_last_error() ("" = none) */
    std::string parent_text;     /* split: must appear in the parent's last error */
    bool root_named = false;     /* the root's address must appear (and no rank be blamed) */
    double max_s = 0;            /* elapsed bound */
};

/* "10.0.0.1:4711": the root's address as the id holds it (bootstrap_uid.c:
 * port at bytes 6..7, IPv4 address at 16..19) and as its errors print it. */
std::string id_addr(const weft_unique_id_t &id)
{
    in_addr a;
    uint16_t port;
    std::memcpy(&port, id.internal + 6, 2);
    std::memcpy(&a, id.internal + 16, 4);
    char host[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &a, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(port));
}

/* Established TCP connections whose local port is `port` (IPv4): the
 * root's accepted (or queued) connections, all ranks being on this host. */
int established_on(uint16_t port)
{
    std::ifstream f("/proc/net/tcp");
    std::string line;
    int n = 0;
    std::getline(f, line);   /* header */
    while (std::getline(f, line)) {
        std::istringstream in(line);
        std::string sl, local, remote, st;
        in >> sl >> local >> remote >> st;
        size_t colon = local.find(':');
        if (colon != std::string::npos && st == "01" &&
            std::strtoul(local.c_str() + colon + 1, nullptr, 16) == port)
            n++;
    }
    return n;
}

/* The victim named ("rank 2" / "peer 2"), and no other rank as the failed
 * one: besides the victim only the reporter's own "rank N" and ranks that
 * passed the news on ("detected by rank N", "reported by rank N"). */
void check_names_victim(const std::string &err, std::vector<std::string> &problems)
{
    static const std::regex named(R"((by )?(rank|peer) (\d+)\b)");
    bool victim_named = false;
    std::string others;
    for (auto it = std::sregex_iterator(err.begin(), err.end(), named); it != std::sregex_iterator(); ++it) {
        const int who = std::atoi((*it)[3].str().c_str());
        const bool is_rank = (*it)[2] == "rank";
        if (who == g_run.victim)
            victim_named = true;
        else if (is_rank && (who == g_run.rank || (*it)[1].matched))
            continue;
        else
            others += (others.empty() ? "" : ", ") + it->str();
    }
    if (!victim_named)
        problems.push_back("the error does not name rank " + std::to_string(g_run.victim));
    if (!others.empty())
        problems.push_back("the error names another rank as failed (" + others + ")");
}

/* Only the reporter's own "rank N" may appear: the root is no rank. */
void check_names_no_rank(const std::string &err, std::vector<std::string> &problems)
{
    static const std::regex named(R"((rank|peer) (\d+)\b)");
    for (auto it = std::sregex_iterator(err.begin(), err.end(), named); it != std::sregex_iterator(); ++it)
        if ((*it)[1] != "rank" || std::atoi((*it)[2].str().c_str()) != g_run.rank)
            problems.push_back("the error blames " + it->str() + " for the root's death");
}

void check_outcome(const Expect &x, int rc, double took, const std::string &err, const std::string &addr,
                   std::vector<std::string> &problems)
{
    bool code_ok = false;
    std::string want;
    for (int c : x.codes) {
        code_ok = code_ok || rc == c;
        want += (want.empty() ? "" : " or ") + std::string(weft_strerror(c));
    }
    if (!code_ok)
        problems.push_back(std::string("returned ") + weft_strerror(rc) + ", expected " + want);
    if (rc == WEFT_SUCCESS)
        return;
    if (!x.text.empty() && err.find(x.text) == std::string::npos)
        problems.push_back("the error lacks \"" + x.text + "\"");
    if (x.root_named) {
        if (err.find("the unique id's root at " + addr) == std::string::npos)
            problems.push_back("the error does not name the root " + addr);
        check_names_no_rank(err, problems);
    } else {
        check_names_victim(err, problems);
    }
    char line[128];
    if (took > x.max_s) {
        std::snprintf(line, sizeof line, "took %.2f s, bound %.2f s", took, x.max_s);
        problems.push_back(line);
    }
}

std::string join(const std::vector<std::string> &v)
{
    std::string s;
    for (const std::string &x : v)
        s += (s.empty() ? "" : "; ") + x;
    return s;
}

weft_comm_t *const kUntouched = reinterpret_cast<weft_comm_t *>(0x5a5a);

/* ---- unique id ---- */

struct Outcome {
    int rc = WEFT_SUCCESS;
    double took = 0;
    std::string err, addr, extra;
};

Outcome run_uid(std::vector<std::string> &problems, Expect &x)
{
    const std::string &k = g_run.kase;
    const double T = g_run.timeout;
    struct {
        weft_unique_id_t id;
        int rc;
    } msg;
    std::memset(&msg, 0, sizeof(msg));
    if (g_run.rank == 0)
        msg.rc = weft_get_unique_id(&msg.id);
    MPI_Bcast(&msg, sizeof(msg), MPI_BYTE, 0, MPI_COMM_WORLD);
    if (msg.rc != WEFT_SUCCESS) {
        if (g_run.rank == g_run.victim)
            _exit(1);
        fail_now("weft_get_unique_id failed on rank 0");
    }
    MPI_Barrier(MPI_COMM_WORLD);   /* the victim's last MPI call */
    Outcome o;
    o.addr = id_addr(msg.id);

    if (g_run.rank == g_run.victim) {
        weft_comm_t *c = nullptr;
        if (k == "uid_absent")
            victim_ends("exits instead of calling weft_comm_init");
        if (k == "uid_root_exit") {
            /* The others' connections are in (each sends its hello right
             * after connecting), then the root's process goes. */
            const uint16_t port = (uint16_t)std::strtoul(o.addr.substr(o.addr.rfind(':') + 1).c_str(), nullptr, 10);
            const double t0 = now_s();
            while (established_on(port) < g_run.size - 1 && now_s() - t0 < 10)
                usleep(10000);
            usleep(300000);
            char why[128];
            std::snprintf(why, sizeof why, "the root's process exits (%d connections seen after %.2f s)",
                          established_on(port), now_s() - t0);
            victim_ends(why);
        }
        g_hook.store(k == "uid_join_exit"  ? HOOK_EXIT_AT_RECV
                     : k == "uid_prep_exit" ? HOOK_EXIT_AT_SHM_OPEN
                     : k == "uid_mid_stop"  ? HOOK_STOP_AT_HOSTNAME
                     : k == "uid_mid_sleep" ? HOOK_SLEEP_AT_HOSTNAME
                                            : HOOK_EXIT_AT_HOSTNAME);
        int rc = weft_comm_init(&msg.id, g_run.size, g_run.rank, &c);
        /* Not reached unless the hook missed its point. */
        std::printf("VICTIM rank %d %s: weft_comm_init returned %s without reaching the hook\n", g_run.rank,
                    k.c_str(), weft_strerror(rc));
        std::fflush(stdout);
        _exit(1);
    }

    /* A death shows at once (the root sees the victim's socket close, the
     * ranks see the root's): less than WEFT_TIMEOUT. A stall costs the
     * root's WEFT_TIMEOUT from the last progress: WEFT_TIMEOUT + 2 s. */
    if (k == "uid_absent") {
        x = {{WEFT_ERR_TIMEOUT}, "rank 2 of 4 never joined", "", false, T + 2};
    } else if (k == "uid_join_exit") {
        /* Rank 3 comes after the victim died: the root tells latecomers too. */
        x = {{WEFT_ERR_TRANSPORT}, "rank 2 of 4 left", "", false, T};
        if (g_run.rank == 3)
            usleep(1000000);
    } else if (k == "uid_mid_exit" || k == "uid_prep_exit") {
        x = {{WEFT_ERR_TRANSPORT}, "rank 2 of 4 left during", "", false, T};
    } else if (k == "uid_mid_stop" || k == "uid_mid_sleep") {
        x = {{WEFT_ERR_TIMEOUT}, "rank 2 of 4 sent nothing for", "", false, T + 2};
    } else if (k == "uid_root_exit") {
        x = {{WEFT_ERR_TRANSPORT}, "its process is gone", "", true, T};
    } else {   /* uid_root_mid_exit */
        x = {{WEFT_ERR_TRANSPORT}, "lost the unique id's root at " + o.addr, "", true, T};
    }
    weft_comm_t *c = kUntouched;
    {
        Watchdog wd(T + 10, "weft_comm_init");
        const double t0 = now_s();
        o.rc = weft_comm_init(&msg.id, g_run.size, g_run.rank, &c);
        o.took = now_s() - t0;
        o.err = weft_last_error();
    }
    if (o.rc == WEFT_SUCCESS) {
        problems.push_back("weft_comm_init succeeded with a rank gone");
        (void)weft_comm_destroy(c);
    } else if (c != kUntouched) {
        problems.push_back("*comm was written on failure");
    }
    return o;
}

Outcome run_split(MPI_Comm survivors_comm, std::vector<std::string> &problems, Expect &x)
{
    const std::string &k = g_run.kase;
    const double T = g_run.timeout;
    weft_comm_t *parent = nullptr;
    int rc = weft_comm_create(MPI_COMM_WORLD, &parent);
    int failed = rc != WEFT_SUCCESS, any_failed = 0;
    MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any_failed) {
        if (g_run.rank == g_run.victim)
            _exit(1);
        fail_now(std::string("weft_comm_create of the parent failed (here: ") + weft_strerror(rc) + ")");
    }
    /* Warm-up: every pipe of the parent carries data once, verified. */
    {
        std::vector<int> all((size_t)g_run.size, -1);
        int mine = 1000 + g_run.rank;
        Watchdog wd(T + 20, "the warm-up allgather");
        rc = weft_allgather(parent, &mine, all.data(), sizeof(int));
        for (int r = 0; rc == WEFT_SUCCESS && r < g_run.size; r++)
            if (all[(size_t)r] != 1000 + r)
                problems.push_back("warm-up allgather: wrong value of rank " + std::to_string(r));
        if (rc != WEFT_SUCCESS)
            problems.push_back(std::string("warm-up allgather failed: ") + weft_comm_last_error(parent));
    }
    MPI_Barrier(MPI_COMM_WORLD);   /* the victim's last MPI call */

    if (g_run.rank == g_run.victim) {
        weft_comm_t *nc = nullptr;
        if (k == "split_exit")
            victim_ends("exits instead of calling weft_comm_split");
        if (k == "split_stop")
            victim_stalls(true, "instead of calling weft_comm_split");
        g_hook.store(k == "split_mid_stop"    ? HOOK_STOP_AT_HOSTNAME
                     : k == "split_mid_exit_late" ? HOOK_EXIT_AT_HOSTNAME
                     : k == "split_mid_sleep" ? HOOK_SLEEP_AT_HOSTNAME
                                              : HOOK_EXIT_AT_HOSTNAME);
        rc = weft_comm_split(parent, 0, g_run.rank, &nc);
        std::printf("VICTIM rank %d %s: weft_comm_split returned %s without reaching the hook\n", g_run.rank,
                    k.c_str(), weft_strerror(rc));
        std::fflush(stdout);
        _exit(1);
    }

    /* The parent's step (an allgather of colors) or the new comm's set-up
     * (all-pairs exchanges over the parent's pipes) fails. A death may
     * only show on the pipes' clock: every case WEFT_TIMEOUT + 2 s. */
    const std::string parent_step = "weft_comm_split: the parent's allgather of the members' colors failed: ";
    /* Mid-split, the victim's last record may or may not have reached a
     * survivor (over tcp its death can reset a connection and drop data
     * already sent), so one survivor fails in the agreement after the
     * settings' exchange ("the split bootstrap failed during ...") and
     * another in that exchange itself; both name the member. */
    const std::string setup = "weft_comm_split: the new comm's set-up failed";
    const std::string setup_step = "new rank 2 (parent rank 2) over the parent's pipes";
    if (k == "split_exit")
        x = {{WEFT_ERR_TRANSPORT, WEFT_ERR_TIMEOUT}, parent_step, parent_step, false, T + 2};
    else if (k == "split_stop")
        x = {{WEFT_ERR_TIMEOUT}, parent_step, parent_step, false, T + 2};
    else if (k == "split_mid_exit" || k == "split_mid_exit_late")
        x = {{WEFT_ERR_TRANSPORT, WEFT_ERR_TIMEOUT}, setup_step, setup, false, T + 2};
    else   /* split_mid_stop, split_mid_sleep */
        x = {{WEFT_ERR_TIMEOUT}, setup_step, setup, false, T + 2};
    if (k == "split_exit" || k == "split_stop")
        usleep(200000);   /* the victim is gone (or stopped) by now */
    unsigned char self_in = 0, self_out = 7;
    if (k == "split_mid_exit_late" && g_run.rank == 0) {
        if (weft_irecv(parent, &self_in, 1, g_run.rank, 4242, &g_self_req) != WEFT_SUCCESS)
            problems.push_back(std::string("irecv from self failed: ") + weft_comm_last_error(parent));
    }
    if (k == "split_mid_exit_late")
        g_hook.store(HOOK_DELAY_AT_HOSTNAME);

    Outcome o;
    weft_comm_t *nc = kUntouched;
    {
        Watchdog wd(T + 10, "weft_comm_split");
        const double t0 = now_s();
        o.rc = weft_comm_split(parent, 0, g_run.rank, &nc);
        o.took = now_s() - t0;
        o.err = weft_last_error();
    }
    {
        char line[96];
        std::snprintf(line, sizeof line, "weft_comm_split returned %s after %.2f s: ", weft_strerror(o.rc), o.took);
        g_so_far = line + o.err;
    }
    if (o.rc == WEFT_SUCCESS) {
        problems.push_back("weft_comm_split succeeded with a member gone");
        (void)weft_comm_destroy(nc);
    } else if (nc != kUntouched) {
        problems.push_back("*newcomm was written on failure");
    }
    /* The parent's last error says it too (the call was made on it). */
    const std::string perr = weft_comm_last_error(parent);
    if (g_self_req != nullptr) {
        weft_status_t st;
        if (weft_send(parent, &self_out, 1, g_run.rank, 4242) != WEFT_SUCCESS ||
            weft_wait(g_self_req, &st) != WEFT_SUCCESS || self_in != self_out)
            problems.push_back(std::string("the message to self on the parent failed: ") +
                               weft_comm_last_error(parent));
        g_self_req = nullptr;
    }
    if (o.rc != WEFT_SUCCESS) {
        if (perr.find(x.parent_text) == std::string::npos)
            problems.push_back("the parent's last error lacks \"" + x.parent_text + "\": " + perr);
        std::vector<std::string> named;
        check_names_victim(perr, named);
        for (const std::string &n : named)
            problems.push_back("parent's last error: " + n);
    }

    /* A victim that slept is alive as far as the parent's pipes know (they
     * timed out on it, which does not mark it failed), so weft_comm_destroy
     * would end in the MPI bootstrap's MPI_Barrier, which the victim never
     * joins: no destroy there (the process _exits). Elsewhere the parent
     * must go away in bounded time. */
    if (k.find("_sleep") != std::string::npos)
        return o;
    {
        Watchdog wd(20, "the survivors' barrier before destroy");
        MPI_Barrier(survivors_comm);
    }
    double destroy_took;
    {
        Watchdog wd(T + 10, "weft_comm_destroy of the parent");
        const double t0 = now_s();
        rc = weft_comm_destroy(parent);
        destroy_took = now_s() - t0;
    }
    char line[128];
    std::snprintf(line, sizeof line, "; parent destroy returned %s after %.2f s", weft_strerror(rc), destroy_took);
    o.extra = line;
    if (destroy_took > T + 2)
        problems.push_back(std::string("parent destroy took more than WEFT_TIMEOUT + 2 s") + line);
    return o;
}

const char *const kCases[] = {
    "uid_absent", "uid_join_exit", "uid_mid_exit", "uid_prep_exit", "uid_mid_stop", "uid_mid_sleep", "uid_root_exit",
    "uid_root_mid_exit", "split_exit", "split_stop", "split_mid_exit", "split_mid_exit_late", "split_mid_stop",
    "split_mid_sleep"};

bool known_case(const std::string &k)
{
    for (const char *c : kCases)
        if (k == c)
            return true;
    return false;
}

} // namespace

int main(int argc, char **argv)
{
    if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
        std::fprintf(stderr, "MPI_Init failed\n");
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &g_run.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_run.size);
    const char *env_case = std::getenv("WEFT_CREATE_FAULT_CASE");
    g_run.kase = argc > 1 ? argv[1] : env_case ? env_case : "";
    const char *t = std::getenv("WEFT_TIMEOUT");
    g_run.timeout = t ? std::atof(t) : 60;
    if (!known_case(g_run.kase) || g_run.size != 4) {
        std::string usage = "usage: weft_mpi_create_faults <case>, on 4 ranks; cases:";
        for (const char *c : kCases)
            usage += std::string(" ") + c;
        fail_now(usage);
    }
    g_run.victim = g_run.kase.rfind("uid_root", 0) == 0 ? 0 : 2;
    const bool victim = g_run.rank == g_run.victim;
    int pid = (int)getpid();
    g_pids.resize((size_t)g_run.size);
    MPI_Allgather(&pid, 1, MPI_INT, g_pids.data(), 1, MPI_INT, MPI_COMM_WORLD);

    /* The survivors' own communicator, for their MPI after the fault. */
    MPI_Comm survivors_comm = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, victim ? MPI_UNDEFINED : 0, g_run.rank, &survivors_comm);

    std::vector<std::string> problems;
    Expect x;
    const bool uid = g_run.kase.rfind("uid_", 0) == 0;
    Outcome o = uid ? run_uid(problems, x) : run_split(survivors_comm, problems, x);
    check_outcome(x, o.rc, o.took, o.err, o.addr, problems);

    char line[256];
    std::snprintf(line, sizeof line, "%s returned %s after %.2f s (bound %.2f s)%s",
                  uid ? "weft_comm_init" : "weft_comm_split", weft_strerror(o.rc), o.took, x.max_s,
                  o.extra.c_str());
    const bool ok = problems.empty();
    std::printf("%s rank %d %s: %s | last error: %s%s\n", ok ? "CREATE-FAULT-OK" : "CREATE-FAULT-FAIL", g_run.rank,
                g_run.kase.c_str(), line, o.err.c_str(), ok ? "" : (" | " + join(problems)).c_str());
    std::fflush(stdout);

    /* One verdict for the run, printed by the first survivor once every
     * survivor's line is out; then a stopped victim is freed. */
    int mine = ok ? 1 : 0, all_ok = 0, srank = -1;
    {
        Watchdog wd(20, "the survivors' verdict");
        MPI_Comm_rank(survivors_comm, &srank);
        MPI_Allreduce(&mine, &all_ok, 1, MPI_INT, MPI_MIN, survivors_comm);
    }
    if (srank == 0 && all_ok) {
        std::printf("CREATE-FAULTS-PASSED %s: %d survivors ok\n", g_run.kase.c_str(), g_run.size - 1);
        std::fflush(stdout);
    }
    if (srank == 0)
        kill_stopped_victim();
    _exit(ok ? 0 : 1);
}
