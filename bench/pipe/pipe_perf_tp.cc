/*
 * pipe_perf_tp: TensorPipe's pipes measured exactly as pipe_perf_weft.c
 * measures weft's (pipe_perf_common.h says how): latency and windowed
 * bandwidth of one message carrying 1 tensor of N bytes or 8 of N/8, with
 * CpuBuffer tensors, Pipe::write / readDescriptor / read.
 *
 *   pipe_perf_tp -t shm|uv -c cma|basic|mpt [options]
 *     -t shm|uv         the transport (the only one registered)
 *     -c cma|basic|mpt  the channel (the only one registered); mpt: -L lanes
 *                       of uv on 127.0.0.1
 *     -L N              mpt lanes (4, as weft's WEFT_TCP_STREAMS default)
 *     -b SIZE -e SIZE   smallest / largest message (8 .. 64m of the fixed list)
 *     -k LIST           tensors per message, "1,8" (default)
 *     -m LIST           "lat,bw" (default), or one of them
 *     -s SCALE          iterations x SCALE
 *     -w cond|spin      how the main thread waits for the end of a run
 *                       (callbacks run on TensorPipe's threads): a condition
 *                       variable (default) or spinning on an atomic flag
 * The process forks: the child (role 1) listens and reads, the parent (role 0)
 * connects and writes; the listener's URL and the end-of-run handshake go
 * over a socketpair. Only role 0 prints results.
 */
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <tensorpipe/tensorpipe.h>

#include "pipe_perf_common.h"

namespace {

constexpr double kStallSeconds = 120.0;
enum Kind { LAT = 0, BW = 1 };

// State of one test. TensorPipe runs the callbacks of one pipe one at a time
// (on its context's loop), so the counters need no lock; the main thread
// only looks at `finished`.
struct Bench {
  std::shared_ptr<tensorpipe::Pipe> pipe;
  int role = 0;
  std::string who;
  Kind kind = LAT;
  size_t size = 0, tb = 0;
  int k = 1, window = 1, warm = 0, timed = 0;
  std::vector<std::vector<unsigned char>> send;   // this role's message, constant
  std::vector<std::vector<unsigned char>> slot;   // slot[s * k + t]
  tensorpipe::Message out, ack;
  int iter = 0, pending = 0;
  long posted = 0, described = 0, reads = 0, writes_cb = 0, total_msgs = 0;
  double t0 = 0;
  std::vector<double> times;
  std::atomic<int> finished{0};
  int failed = 0;
  bool use_cond = true;
  std::mutex mu;
  std::condition_variable cv;

  void finish(bool fail) {
    if (fail) failed = 1;
    std::lock_guard<std::mutex> g(mu);
    finished.store(1);
    cv.notify_one();
  }
  bool bad(const char* what, const tensorpipe::Error& e) {
    fprintf(stderr, "%s: %s failed: %s\n", who.c_str(), what, e.what().c_str());
    finish(true);
    return false;
  }
};

bool checkDesc(Bench& b, const tensorpipe::Descriptor& d) {
  if (d.tensors.size() != (size_t)b.k || !d.payloads.empty()) {
    fprintf(stderr, "%s: DATA CHECK FAILED: descriptor has %zu tensors, %zu payloads (expected %d, 0)\n",
            b.who.c_str(), d.tensors.size(), d.payloads.size(), b.k);
    return false;
  }
  for (int t = 0; t < b.k; t++) {
    if (d.tensors[t].length != b.tb || d.tensors[t].sourceDevice.type != tensorpipe::kCpuDeviceType) {
      fprintf(stderr, "%s: DATA CHECK FAILED: descriptor tensor %d: %zu bytes on %s (expected %zu, cpu)\n",
              b.who.c_str(), t, d.tensors[t].length, d.tensors[t].sourceDevice.toString().c_str(), b.tb);
      return false;
    }
  }
  return true;
}

// The allocation for slot s, spot bytes poisoned.
tensorpipe::Allocation allocFor(Bench& b, int s) {
  tensorpipe::Allocation a;
  int dir = 1 - b.role;
  a.tensors.resize(b.k);
  for (int t = 0; t < b.k; t++) {
    unsigned char* p = b.slot[s * b.k + t].data();
    pp_poison(p, b.tb, b.size, t, dir);
    a.tensors[t].buffer = tensorpipe::CpuBuffer{p};
  }
  return a;
}

bool checkSlot(Bench& b, int s, bool full) {
  int dir = 1 - b.role;
  for (int t = 0; t < b.k; t++) {
    const unsigned char* p = b.slot[s * b.k + t].data();
    if ((full ? pp_check(p, b.tb, b.size, t, dir, b.who.c_str()) : pp_spot(p, b.tb, b.size, t, dir, b.who.c_str())) != 0)
      return false;
  }
  return true;
}

// ---- latency, role 0: write, read the echo, next round trip from the read callback ----
void lat0Start(Bench& b);
void lat0MaybeDone(Bench& b) {
  if (b.iter == b.warm + b.timed && b.writes_cb == b.total_msgs) b.finish(false);
}
void lat0Start(Bench& b) {
  b.t0 = pp_now_us();
  b.pipe->readDescriptor([&b](const tensorpipe::Error& e, tensorpipe::Descriptor d) {
    if (e) { b.bad("readDescriptor (echo)", e); return; }
    if (!checkDesc(b, d)) { b.finish(true); return; }
    b.pipe->read(allocFor(b, 0), [&b](const tensorpipe::Error& e) {
      if (e) { b.bad("read (echo)", e); return; }
      double t = pp_now_us();
      if (!checkSlot(b, 0, b.iter == 0)) { b.finish(true); return; }
      if (b.iter >= b.warm) b.times[b.iter - b.warm] = (t - b.t0) / 2;
      if (++b.iter == b.warm + b.timed) { lat0MaybeDone(b); return; }
      lat0Start(b);
    });
  });
  b.pipe->write(b.out, [&b](const tensorpipe::Error& e) {
    if (e) { b.bad("write", e); return; }
    b.writes_cb++;
    lat0MaybeDone(b);
  });
}

// ---- role 1: read every message; LAT: echo each; BW: ack each window ----
void r1MaybeDone(Bench& b) {
  long writes = b.kind == LAT ? b.total_msgs : b.total_msgs / b.window;
  if (b.reads == b.total_msgs && b.writes_cb == writes) b.finish(false);
}
void r1Write(Bench& b, const tensorpipe::Message& m) {
  b.pipe->write(m, [&b](const tensorpipe::Error& e) {
    if (e) { b.bad("write", e); return; }
    b.writes_cb++;
    r1MaybeDone(b);
  });
}
void r1Post(Bench& b) {
  b.posted++;
  b.pipe->readDescriptor([&b](const tensorpipe::Error& e, tensorpipe::Descriptor d) {
    if (e) { b.bad("readDescriptor", e); return; }
    if (!checkDesc(b, d)) { b.finish(true); return; }
    // BW: descriptors run ahead of reads on purpose; slot = message index mod
    // window, free again because the writer waits for the window's ack.
    long idx = b.described++;
    int s = b.kind == LAT ? 0 : (int)(idx % b.window);
    b.pipe->read(allocFor(b, s), [&b, s](const tensorpipe::Error& e) {
      if (e) { b.bad("read", e); return; }
      long idx = b.reads;
      if (!checkSlot(b, s, idx < (b.kind == LAT ? 1 : b.window))) { b.finish(true); return; }
      b.reads++;
      if (b.kind == LAT) r1Write(b, b.out);
      else if (b.reads % b.window == 0) r1Write(b, b.ack);
      if (b.kind == LAT && b.posted < b.total_msgs) r1Post(b);
      r1MaybeDone(b);
    });
    if (b.kind == BW && b.posted < b.total_msgs) r1Post(b);
  });
}

// ---- bandwidth, role 0: a window of writes, then the ack; next window from the last callback ----
void bw0Start(Bench& b);
void bw0Step(Bench& b) {
  if (--b.pending > 0) return;
  double t = pp_now_us();
  if (b.iter >= b.warm) b.times[b.iter - b.warm] = t - b.t0;
  if (++b.iter == b.warm + b.timed) { b.finish(false); return; }
  bw0Start(b);
}
void bw0Start(Bench& b) {
  b.pending = b.window + 1;
  b.t0 = pp_now_us();
  b.pipe->readDescriptor([&b](const tensorpipe::Error& e, tensorpipe::Descriptor d) {
    if (e) { b.bad("readDescriptor (ack)", e); return; }
    if (!d.tensors.empty() || d.metadata.size() != 1) {
      fprintf(stderr, "%s: DATA CHECK FAILED: ack descriptor: %zu tensors, %zu metadata bytes\n", b.who.c_str(),
              d.tensors.size(), d.metadata.size());
      b.finish(true);
      return;
    }
    b.pipe->read(tensorpipe::Allocation{}, [&b](const tensorpipe::Error& e) {
      if (e) { b.bad("read (ack)", e); return; }
      bw0Step(b);
    });
  });
  for (int j = 0; j < b.window; j++) {
    b.pipe->write(b.out, [&b](const tensorpipe::Error& e) {
      if (e) { b.bad("write", e); return; }
      bw0Step(b);
    });
  }
}

bool waitEnd(Bench& b) {
  double start = pp_now_us();
  if (b.use_cond) {
    std::unique_lock<std::mutex> g(b.mu);
    while (!b.finished.load() && pp_now_us() - start < kStallSeconds * 1e6)
      b.cv.wait_for(g, std::chrono::seconds(1));
  } else {
    unsigned long n = 0;
    while (!b.finished.load(std::memory_order_acquire))
      if ((++n & 0xfffff) == 0 && pp_now_us() - start > kStallSeconds * 1e6) break;
  }
  if (!b.finished.load()) {
    fprintf(stderr, "%s: stalled: no end after %.0f s (size %zu, %d tensors, %s)\n", b.who.c_str(), kStallSeconds,
            b.size, b.k, b.kind == LAT ? "lat" : "bw");
    return false;
  }
  return !b.failed;
}

void setupTest(Bench& b, size_t size, int k, Kind kind, double scale) {
  b.size = size;
  b.k = k;
  b.tb = size / (size_t)k;
  b.kind = kind;
  b.window = kind == LAT ? 1 : pp_window(size);
  int iters = kind == LAT ? pp_lat_iters(size, scale) : pp_bw_windows(size, scale);
  b.warm = pp_warmup(iters);
  b.timed = iters;
  b.times.assign(iters, 0.0);
  b.slot.assign((size_t)b.window * k, std::vector<unsigned char>(b.tb ? b.tb : 1));
  b.send.assign(k, std::vector<unsigned char>(b.tb ? b.tb : 1));
  b.out = tensorpipe::Message();
  b.out.tensors.resize(k);
  for (int t = 0; t < k; t++) {
    pp_fill(b.send[t].data(), b.tb, size, t, b.role);
    b.out.tensors[t].buffer = tensorpipe::CpuBuffer{b.send[t].data()};
    b.out.tensors[t].length = b.tb;
  }
  b.ack = tensorpipe::Message();
  b.ack.metadata = "a";
  b.iter = b.pending = 0;
  b.posted = b.described = b.reads = b.writes_cb = 0;
  b.total_msgs = kind == LAT ? (long)(b.warm + b.timed) : (long)(b.warm + b.timed) * b.window;
  b.finished.store(0);
  b.failed = 0;
}

bool runTest(Bench& b, double* median) {
  if (b.role == 0) {
    if (b.kind == LAT) lat0Start(b);
    else bw0Start(b);
  } else {
    r1Post(b);
  }
  if (!waitEnd(b)) return false;
  *median = b.role == 0 ? pp_median(b.times.data(), b.timed) : 0.0;
  return true;
}

bool has(const std::string& list, const std::string& word) {
  size_t pos = 0;
  while ((pos = list.find(word, pos)) != std::string::npos) {
    bool start = pos == 0 || list[pos - 1] == ',';
    bool end = pos + word.size() == list.size() || list[pos + word.size()] == ',';
    if (start && end) return true;
    pos += word.size();
  }
  return false;
}

std::shared_ptr<tensorpipe::Context> makeContext(const std::string& transport, const std::string& channel, int lanes,
                                                 const std::string& name) {
  auto ctx = std::make_shared<tensorpipe::Context>(tensorpipe::ContextOptions().name(name));
  if (transport == "shm") ctx->registerTransport(0, "shm", tensorpipe::transport::shm::create());
  else ctx->registerTransport(0, "uv", tensorpipe::transport::uv::create());
  if (channel == "cma") {
    ctx->registerChannel(0, "cma", tensorpipe::channel::cma::create());
  } else if (channel == "basic") {
    ctx->registerChannel(0, "basic", tensorpipe::channel::basic::create());
  } else {
    std::vector<std::shared_ptr<tensorpipe::transport::Context>> contexts;
    std::vector<std::shared_ptr<tensorpipe::transport::Listener>> listeners;
    for (int i = 0; i < lanes; i++) {
      contexts.push_back(tensorpipe::transport::uv::create());
      listeners.push_back(contexts.back()->listen("127.0.0.1"));
    }
    ctx->registerChannel(0, "mpt", tensorpipe::channel::mpt::create(std::move(contexts), std::move(listeners)));
  }
  return ctx;
}

bool writeAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, c, n);
    if (w <= 0) return false;
    c += w;
    n -= (size_t)w;
  }
  return true;
}
bool readAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= (size_t)r;
  }
  return true;
}

void usage() {
  fprintf(stderr, "usage: pipe_perf_tp -t shm|uv -c cma|basic|mpt [-L lanes] [-b SIZE] [-e SIZE] [-k 1,8] "
                  "[-m lat,bw] [-s SCALE] [-w cond|spin]\n");
}

}  // namespace

int main(int argc, char** argv) {
  size_t lo = 8, hi = 64 * PP_MIB;
  std::string transport = "shm", channel = "cma", klist = "1,8", mlist = "lat,bw", wait = "cond";
  int lanes = 4;
  double scale = 1.0;
  for (int i = 1; i < argc; i += 2) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (!v || a[0] != '-' || a[2]) { usage(); return 2; }
    switch (a[1]) {
      case 't': transport = v; break;
      case 'c': channel = v; break;
      case 'L': lanes = atoi(v); break;
      case 'b': lo = pp_parse_size(v); break;
      case 'e': hi = pp_parse_size(v); break;
      case 'k': klist = v; break;
      case 'm': mlist = v; break;
      case 's': scale = atof(v); break;
      case 'w': wait = v; break;
      default: usage(); return 2;
    }
  }
  if ((transport != "shm" && transport != "uv") || (channel != "cma" && channel != "basic" && channel != "mpt") ||
      (wait != "cond" && wait != "spin") || lanes < 1 || lo == 0 || hi < lo || scale <= 0) {
    usage();
    return 2;
  }
  std::string conf = transport + "+" + channel + (channel == "mpt" ? std::to_string(lanes) : "");
  if (wait == "spin") conf += "+spin";

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) { perror("socketpair"); return 1; }
  fflush(stdout);
  pid_t child = fork();
  if (child < 0) { perror("fork"); return 1; }
  int role = child == 0 ? 1 : 0;
  int fd = sv[role];
  close(sv[1 - role]);

  static Bench B;
  Bench& b = B;
  b.role = role;
  b.who = "pipe_perf_tp role " + std::to_string(role);
  b.use_cond = wait == "cond";
  auto ctx = makeContext(transport, channel, lanes, role ? "server" : "client");
  std::shared_ptr<tensorpipe::Listener> listener;
  if (role == 1) {
    listener = ctx->listen({transport == "shm" ? std::string("shm://") : std::string("uv://127.0.0.1")});
    std::promise<std::shared_ptr<tensorpipe::Pipe>> accepted;
    listener->accept([&accepted](const tensorpipe::Error& e, std::shared_ptr<tensorpipe::Pipe> p) {
      if (e) fprintf(stderr, "pipe_perf_tp role 1: accept failed: %s\n", e.what().c_str());
      accepted.set_value(e ? nullptr : std::move(p));
    });
    std::string url = listener->url(transport);
    uint32_t n = (uint32_t)url.size();
    if (!writeAll(fd, &n, sizeof n) || !writeAll(fd, url.data(), n)) { perror("send url"); _exit(1); }
    auto fut = accepted.get_future();
    if (fut.wait_for(std::chrono::seconds((long)kStallSeconds)) != std::future_status::ready) {
      fprintf(stderr, "pipe_perf_tp role 1: no connection\n");
      _exit(1);
    }
    b.pipe = fut.get();
    if (!b.pipe) _exit(1);
  } else {
    uint32_t n = 0;
    std::string url;
    if (!readAll(fd, &n, sizeof n) || n > 4096) { fprintf(stderr, "pipe_perf_tp: no url from role 1\n"); return 1; }
    url.resize(n);
    if (!readAll(fd, &url[0], n)) { fprintf(stderr, "pipe_perf_tp: no url from role 1\n"); return 1; }
    b.pipe = ctx->connect(url);
    double load = 0;
    FILE* f = fopen("/proc/loadavg", "r");
    if (f) { if (fscanf(f, "%lf", &load) != 1) load = 0; fclose(f); }
    printf("# pipe_perf_tp conf=%s transport=%s channel=%s%s wait=%s url=%s load=%.2f\n", conf.c_str(),
           transport.c_str(), channel.c_str(), channel == "mpt" ? (" lanes=" + std::to_string(lanes)).c_str() : "",
           wait.c_str(), url.c_str(), load);
    fflush(stdout);
  }

  int status = 0;
  for (size_t si = 0; si < PP_NSIZES && status == 0; si++) {
    size_t size = pp_sizes[si];
    if (size < lo || size > hi) continue;
    for (int k = 1; k <= PP_MAX_TENSORS && status == 0; k++) {
      if (!has(klist, std::to_string(k))) continue;
      double med[2] = {0, 0};
      int iters[2] = {0, 0}, window = 0;
      for (int kind = LAT; kind <= BW && status == 0; kind++) {
        if (!has(mlist, kind == LAT ? "lat" : "bw")) continue;
        setupTest(b, size, k, (Kind)kind, scale);
        status = runTest(b, &med[kind]) ? 0 : 1;
        iters[kind] = b.timed;
        if (kind == BW) window = b.window;
      }
      if (status == 0 && role == 0)
        pp_print_row("tensorpipe", conf.c_str(), size, k, med[LAT], iters[LAT],
                     med[BW] > 0 ? (double)size * window / (med[BW] * 1e3) : 0.0, window, iters[BW]);
    }
  }
  // The end: role 1 says it is done (its last writes were called back), so
  // role 0 closes nothing the other side still uses.
  char c = status ? 'F' : 'D';
  if (role == 1) {
    if (!writeAll(fd, &c, 1)) status = 1;
  } else if (!readAll(fd, &c, 1) || c != 'D') {
    fprintf(stderr, "pipe_perf_tp: role 1 did not finish\n");
    status = 1;
  }
  if (status != 0) {
    fprintf(stderr, "%s: FAILED\n", b.who.c_str());
    if (role == 0) {
      int ws = 0;
      if (waitpid(child, &ws, WNOHANG) == child)  // role 1 died first: say how
        fprintf(stderr, "pipe_perf_tp: role 1 ended first: %s %d\n", WIFSIGNALED(ws) ? "signal" : "exit status",
                WIFSIGNALED(ws) ? WTERMSIG(ws) : WEXITSTATUS(ws));
      else
        kill(child, SIGTERM);  // it may be waiting for messages that will not come
    }
    _exit(1);  // TensorPipe's threads may still hold callbacks into b: no orderly teardown
  }
  b.pipe->close();
  if (listener) listener->close();
  ctx->close();
  ctx->join();
  b.pipe.reset();
  if (role == 1) _exit(0);
  int ws = 0;
  if (waitpid(child, &ws, 0) < 0 || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
    fprintf(stderr, "pipe_perf_tp: role 1 failed (status 0x%x)\n", ws);
    return 1;
  }
  return 0;
}
