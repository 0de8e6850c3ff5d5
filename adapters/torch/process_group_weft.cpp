// ProcessGroupWeft: torch.distributed operations on weft's calls
// (process_group_weft.hpp says how the pieces fit).
#include "process_group_weft.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/extension.h>
#include <torch/csrc/utils/pybind.h>
#include <pybind11/chrono.h>

// CUDA tensors go through weft's stream-ordered calls on torch's current
// stream, only where torch itself was built with CUDA (CMake defines
// WEFT_TORCH_CUDA then: a CPU-only torch may still ship c10/cuda headers).
#if defined(WEFT_TORCH_CUDA) && defined(__has_include)
#if __has_include(<c10/cuda/CUDAStream.h>)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#define WEFT_TORCH_HAVE_CUDA 1
#endif
#endif
#ifndef WEFT_TORCH_HAVE_CUDA
#define WEFT_TORCH_HAVE_CUDA 0
#endif

namespace weft_torch {
namespace {


[[noreturn]] void fail(const std::string& op, const std::string& why) {
  throw std::runtime_error("weft backend: " + op + ": " + why);
}

std::string rankStr(int r) { return std::to_string(r); }

// weft's code and its last error on the comm. The text already ends with
// the code's meaning when it is about this failure; the meaning is added
// when the text says nothing or is about something else.
std::string weftWhy(int rc, const weft_comm_t* comm) {
  const char* last = comm ? weft_comm_last_error(comm) : "";
  std::string code = weft_strerror(rc);
  if (!last || !*last)
    return code;
  std::string text = last;
  return text.find(code) == std::string::npos ? code + ": " + text : text;
}

size_t nbytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

// Reductions: the dtypes and operations weft reduces.
weft_dtype_t weftDtype(const std::string& op, at::ScalarType s) {
  switch (s) {
    case at::kFloat: return WEFT_FLOAT32;
    case at::kDouble: return WEFT_FLOAT64;
    case at::kHalf: return WEFT_FLOAT16;
    case at::kBFloat16: return WEFT_BFLOAT16;
    case at::kChar: return WEFT_INT8;
    case at::kByte: return WEFT_UINT8;
    case at::kInt: return WEFT_INT32;
    case at::kLong: return WEFT_INT64;
    default: break;
  }
  fail(op, std::string("dtype ") + c10::toString(s) +
               " is not supported for reductions (weft reduces float32, float64, float16, bfloat16, "
               "int8, uint8, int32, int64)");
}

const char* redOpName(c10d::ReduceOp::RedOpType o) {
  switch (o) {
    case c10d::ReduceOp::SUM: return "SUM";
    case c10d::ReduceOp::AVG: return "AVG";
    case c10d::ReduceOp::PRODUCT: return "PRODUCT";
    case c10d::ReduceOp::MIN: return "MIN";
    case c10d::ReduceOp::MAX: return "MAX";
    case c10d::ReduceOp::BAND: return "BAND";
    case c10d::ReduceOp::BOR: return "BOR";
    case c10d::ReduceOp::BXOR: return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNKNOWN";
  }
}

weft_op_t weftOp(const std::string& op, const c10d::ReduceOp& r, at::ScalarType s) {
  switch (r.op_) {
    case c10d::ReduceOp::SUM: return WEFT_SUM;
    case c10d::ReduceOp::AVG: return WEFT_AVG;
    case c10d::ReduceOp::PRODUCT: return WEFT_PROD;
    case c10d::ReduceOp::MIN: return WEFT_MIN;
    case c10d::ReduceOp::MAX: return WEFT_MAX;
    default: break;
  }
  fail(op, std::string("ReduceOp ") + redOpName(r.op_) + " is not supported (dtype " + c10::toString(s) +
               "; weft reduces with SUM, PRODUCT, MIN, MAX, AVG)");
}

#if WEFT_TORCH_HAVE_CUDA
bool isCuda(const at::Tensor& t) { return t.device().is_cuda(); }
#endif

// Every tensor of an operation: defined, dense, on the CPU or (where built)
// a CUDA device, all on one device type.
void checkTensors(const std::string& op, const std::vector<at::Tensor>& ts) {
  for (size_t i = 0; i < ts.size(); i++) {
    const at::Tensor& t = ts[i];
    if (!t.defined())
      fail(op, "tensor " + std::to_string(i) + " is undefined");
    if (t.is_sparse())
      fail(op, "sparse tensors are not supported");
    if (t.device().is_cuda()) {
#if !WEFT_TORCH_HAVE_CUDA
      fail(op, "CUDA tensors need weft_torch built against a torch with CUDA (this build is CPU-only)");
#endif
    } else if (!t.device().is_cpu()) {
      fail(op, "tensors on " + t.device().str() + " are not supported (CPU and CUDA only)");
    }
    if (i > 0 && t.device().type() != ts[0].device().type())
      fail(op, "tensors on different device types (" + ts[0].device().str() + " and " + t.device().str() + ")");
  }
}

void checkOne(const std::string& op, const std::vector<at::Tensor>& ts) {
  if (ts.size() != 1)
    fail(op, "expects exactly one tensor per call (got " + std::to_string(ts.size()) + ")");
  checkTensors(op, ts);
}

void checkSameKind(const std::string& op, const at::Tensor& ref, const at::Tensor& t, const char* what) {
  if (t.scalar_type() != ref.scalar_type())
    fail(op, std::string(what) + " has dtype " + c10::toString(t.scalar_type()) + ", expected " +
                 c10::toString(ref.scalar_type()));
  if (t.numel() != ref.numel())
    fail(op, std::string(what) + " has " + std::to_string(t.numel()) + " elements, expected " +
                 std::to_string(ref.numel()));
}

void checkRoot(const std::string& op, int64_t root, int size) {
  if (root < 0 || root >= size)
    fail(op, "root rank " + std::to_string(root) + " is out of range (group of " + std::to_string(size) + ")");
}

// User tags are weft's tags as they are (weft's own lanes are negative).
void checkUserTag(const std::string& op, int tag) {
  if (tag < 0)
    fail(op, "tag " + std::to_string(tag) + " is out of range (0 .. " + std::to_string(INT_MAX) + ")");
}

enum class Use { In, Out, InOut };

// A contiguous tensor weft can use for `t`: `t` itself when it is
// contiguous, else a contiguous copy (its contents copied in for In/InOut)
// whose result is copied back into `t` once the operation completed
// (Out/InOut). The buffer stays alive with the operation.
at::Tensor stage(PendingOp& op, const at::Tensor& t, Use use) {
  if (t.is_contiguous()) {
    op.keep.push_back(t);
    return t;
  }
  at::Tensor c = use == Use::Out ? at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous))
                                 : t.contiguous();
  op.keep.push_back(c);
  if (use != Use::In) {
    at::Tensor user = t;
    op.finish.push_back([user, c]() mutable { user.copy_(c); });
  }
  return c;
}

// A fresh contiguous buffer of n elements like t.
at::Tensor scratch(PendingOp& op, const at::Tensor& like, int64_t n) {
  at::Tensor s = at::empty({n}, like.options().memory_format(at::MemoryFormat::Contiguous));
  op.keep.push_back(s);
  return s;
}

}  // namespace

// ============================================================== PendingOp

void PendingOp::fail(int rc, const char* where) {
  if (err != WEFT_SUCCESS)
    return;
  err = rc;
  // weft's own text names the rank, the peer and why; keep it whole.
  errText = "weft backend: " + name + " failed on rank " + rankStr(rank) + " in " + where + ": " + weftWhy(rc, comm);
}

void PendingOp::finishLocked() {
  if (err == WEFT_SUCCESS) {
    try {
      for (auto& f : finish)
        f();
    } catch (const std::exception& e) {
      err = WEFT_ERR_INTERNAL;
      errText = "weft backend: " + name + " on rank " + rankStr(rank) + ": copying the result back failed: " + e.what();
    }
  }
  finish.clear();
  done.store(true, std::memory_order_release);
}

bool PendingOp::poll() {
  if (isDone())
    return true;
  std::unique_lock<std::mutex> lk(mu, std::try_to_lock);
  if (!lk.owns_lock() || isDone())
    return isDone();
  bool all = true;
  for (auto& r : reqs) {
    if (!r)
      continue;
    int finished = 0;
    weft_status_t st;
    int rc = weft_test(r, &finished, &st);
    if (finished || rc == WEFT_ERR_INVALID_ARG) {
      // Completed (weft freed it), or a handle weft no longer knows: either
      // way it must not be touched again.
      r = nullptr;
      if (rc != WEFT_SUCCESS)
        fail(rc, "weft_test");
    } else {
      if (rc != WEFT_SUCCESS)
        fail(rc, "weft_test");
      all = false;
    }
  }
  if (all)
    finishLocked();
  return all;
}

void PendingOp::waitAll() {
  if (isDone())
    return;
  std::lock_guard<std::mutex> lk(mu);
  if (isDone())
    return;
  std::vector<weft_status_t> st(reqs.size());
  int rc = reqs.empty() ? WEFT_SUCCESS : weft_waitall(reqs.size(), reqs.data(), st.data());
  // weft_waitall freed every request (NULL ones count as done).
  std::fill(reqs.begin(), reqs.end(), nullptr);
  if (rc != WEFT_SUCCESS)
    fail(rc, "weft_waitall");
  finishLocked();
}

bool PendingOp::waitUntil(std::chrono::steady_clock::time_point deadline) {
  // weft progresses inside weft_test; back off from a spin to short sleeps
  // so a waiting rank leaves the cores to its peers.
  auto nap = std::chrono::microseconds(20);
  while (!poll()) {
    if (std::chrono::steady_clock::now() >= deadline)
      return false;
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(2000));
  }
  return true;
}

std::string PendingOp::error() const {
  std::lock_guard<std::mutex> lk(mu);
  return errText;
}

int PendingOp::errorCode() const {
  std::lock_guard<std::mutex> lk(mu);
  return err;
}

// ============================================================== WorkWeft

WorkWeft::WorkWeft(std::shared_ptr<PendingOp> op, int rank, c10d::OpType type, const char* profilingTitle,
                   const c10::optional<std::vector<at::Tensor>>& inputs, int sourceRank)
    : c10d::Work(rank, type, profilingTitle, inputs), op_(std::move(op)), sourceRank_(sourceRank) {}

// The op may outlive this Work: the process group completes it later.
WorkWeft::~WorkWeft() = default;

void WorkWeft::settle() {
  std::call_once(settled_, [this] {
    std::string e = op_->error();
    finish(e.empty() ? nullptr : std::make_exception_ptr(std::runtime_error(e)));
  });
}

bool WorkWeft::isCompleted() {
  if (!op_->poll())
    return false;
  settle();
  return true;
}

bool WorkWeft::isSuccess() const { return op_->isDone() && op_->errorCode() == WEFT_SUCCESS; }

std::exception_ptr WorkWeft::exception() const {
  {
    std::lock_guard<std::mutex> lk(mutex_);
    if (exception_)
      return exception_;
  }
  // Done but not yet settled (isSuccess() seen before isCompleted()).
  std::string e = op_->isDone() ? op_->error() : std::string();
  return e.empty() ? nullptr : std::make_exception_ptr(std::runtime_error(e));
}

int WorkWeft::sourceRank() const {
  if (sourceRank_ < 0)
    throw std::runtime_error("weft backend: sourceRank() is only defined for a recv (" + op_->name + ")");
  return sourceRank_;
}

std::vector<at::Tensor> WorkWeft::result() { return op_->outputs; }

bool WorkWeft::wait(std::chrono::milliseconds timeout) {
  if (timeout == kNoTimeout) {
    op_->waitAll();
  } else if (!op_->waitUntil(std::chrono::steady_clock::now() + timeout)) {
    throw std::runtime_error("weft backend: " + op_->name + " on rank " + rankStr(op_->rank) +
                             ": Work.wait timed out after " + std::to_string(timeout.count()) +
                             " ms (the operation is still pending; weft's own bound is WEFT_TIMEOUT)");
  }
  settle();
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lk(mutex_);
    e = exception_;
  }
  if (e)
    std::rethrow_exception(e);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkWeft::getFuture() {
  op_->waitAll();
  settle();
  std::vector<c10::Device> devices;
  for (const auto& t : op_->outputs)
    if (t.device().is_cuda() && std::find(devices.begin(), devices.end(), t.device()) == devices.end())
      devices.push_back(t.device());
  auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
  std::exception_ptr e = exception();
  if (e)
    fut->setError(e);
  else
    fut->markCompleted(c10::IValue(op_->outputs));
  return fut;
}

// ============================================================== the group

namespace {

// "1800.000": torch's timeout as WEFT_TIMEOUT seconds (weft refuses exponents
// and hexadecimal; 0 would mean "forever", so at least a millisecond).
std::string weftSeconds(std::chrono::milliseconds t) {
  long long ms = std::max<long long>(t.count(), 1);
  ms = std::min<long long>(ms, 1000000000LL * 1000);
  char buf[48];
  std::snprintf(buf, sizeof buf, "%lld.%03lld", ms / 1000, ms % 1000);
  return buf;
}

}  // namespace

ProcessGroupWeft::ProcessGroupWeft(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                   std::chrono::milliseconds timeout)
    : PGBase(rank, size) {
  const std::string op = "creating the process group";
  if (!store)
    fail(op, "no store");
  if (size < 1 || rank < 0 || rank >= size)
    fail(op, "rank " + std::to_string(rank) + " of " + std::to_string(size) + " is out of range");

  // weft bounds every wait for progress by WEFT_TIMEOUT; unless the user
  // chose it (in the environment), this group's comm follows the group's
  // timeout, so weft gives up when torch would. It is the comm's own
  // setting (weft_config_t): the environment is never written.
  const char* user_timeout = std::getenv("WEFT_TIMEOUT");
  weftTimeout_ = user_timeout ? user_timeout : weftSeconds(timeout);
  // torch calls a process group from several threads (the autograd
  // engine's, a watchdog's, the caller's), so the comm keeps its lock
  // whatever WEFT_THREADS says in the environment (docs/api.md).
  const weft_setting_t settings[] = {{"WEFT_THREADS", "multiple"}, {"WEFT_TIMEOUT", weftTimeout_.c_str()}};
  weft_config_t config = WEFT_CONFIG_INITIALIZER;
  config.settings = settings;
  config.nsettings = user_timeout == nullptr ? 2 : 1;

  // Several groups may share a store (a re-init over the same file store):
  // each creation takes the next generation. Every rank adds before it joins
  // weft_comm_init, which completes only when all have joined, so the adds
  // of one creation all land before any of the next.
  int64_t v = store->add("weft/generation", 1);
  const std::string key = "weft/uid/" + std::to_string((v - 1) / size);

  weft_unique_id_t id;
  if (rank == 0) {
    int rc = weft_get_unique_id_config(&id, &config);
    if (rc != WEFT_SUCCESS) {
      std::string why = std::string("weft_get_unique_id: ") + weft_strerror(rc) + ": " + weft_last_error();
      // Tell the others at once rather than let them wait out the store.
      std::vector<uint8_t> msg(why.begin(), why.end());
      if (msg.size() == WEFT_UNIQUE_ID_BYTES)
        msg.push_back('.');
      store->set(key, msg);
      fail(op, why);
    }
    store->set(key, std::vector<uint8_t>(id.internal, id.internal + WEFT_UNIQUE_ID_BYTES));
  } else {
    std::vector<uint8_t> got;
    try {
      got = store->get(key);
    } catch (const std::exception& e) {
      fail(op, "rank " + std::to_string(rank) + " waited for rank 0's weft unique id (store key \"" + key +
                   "\") in vain: " + e.what());
    }
    if (got.size() != WEFT_UNIQUE_ID_BYTES)
      fail(op, "rank 0 could not make the weft unique id: " + std::string(got.begin(), got.end()));
    std::memcpy(id.internal, got.data(), WEFT_UNIQUE_ID_BYTES);
  }
  int rc = weft_comm_init_config(&id, size, rank, &config, &comm_);
  if (rc != WEFT_SUCCESS)
    fail(op, "weft_comm_init (rank " + std::to_string(rank) + " of " + std::to_string(size) +
                 "): " + weft_strerror(rc) + ": " + weft_last_error());
#if !WEFT_TORCH_BACKEND_API
  init();  // c10d::ProcessGroup's logging set-up
#endif
}

ProcessGroupWeft::~ProcessGroupWeft() {
  // Operations still pending (their Works dropped or never waited) write
  // into tensors they hold: complete them before the comm goes. Their errors
  // belong to their Works.
  std::vector<std::shared_ptr<PendingOp>> ops;
  {
    std::lock_guard<std::mutex> lk(pendingMu_);
    ops.swap(pending_);
  }
  for (auto& op : ops)
    op->waitAll();
  if (comm_) {
    int rc = weft_comm_destroy(comm_);
    if (rc != WEFT_SUCCESS && rc != WEFT_ERR_ABORTED)
      std::fprintf(stderr, "weft backend: rank %d: weft_comm_destroy: %s\n", getRank(), weft_strerror(rc));
    comm_ = nullptr;
  }
}

void ProcessGroupWeft::abort() {
  if (comm_)
    weft_comm_abort(comm_);
}

std::string ProcessGroupWeft::lastError() const { return comm_ ? weft_comm_last_error(comm_) : ""; }

void ProcessGroupWeft::sweep() {
  std::lock_guard<std::mutex> lk(pendingMu_);
  // Drop what completed; drive the operations nobody holds a Work for (a
  // fire-and-forget isend), so their buffers are released without a wait.
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                [](const std::shared_ptr<PendingOp>& op) {
                                  return op->isDone() || (op.use_count() == 1 && op->poll());
                                }),
                 pending_.end());
}

std::shared_ptr<PendingOp> ProcessGroupWeft::newOp(std::string name) {
  sweep();
  if (!comm_)
    fail(name, "the process group has no weft comm");
  return std::make_shared<PendingOp>(comm_, getRank(), std::move(name));
}

void ProcessGroupWeft::check(int rc, const std::string& op, const char* call) const {
  if (rc == WEFT_SUCCESS)
    return;
  fail(op, std::string(call) + " on rank " + rankStr(getRank()) + ": " + weftWhy(rc, comm_));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::launch(std::shared_ptr<PendingOp> op, c10d::OpType type,
                                                        const char* title, const std::vector<at::Tensor>& inputs,
                                                        int sourceRank) {
  if (op->reqs.empty())
    op->waitAll();  // nothing in flight (stream-ordered, or local only): run the copy-backs now
  {
    std::lock_guard<std::mutex> lk(pendingMu_);
    if (!op->isDone())
      pending_.push_back(op);
  }
  return c10::make_intrusive<WorkWeft>(std::move(op), getRank(), type, title,
                                       c10::optional<std::vector<at::Tensor>>(inputs), sourceRank);
}

// ============================================================== starting
//
// One Starter per operation: it starts weft's non-blocking calls on host
// tensors, or the stream-ordered calls on the current CUDA stream for CUDA
// tensors (then nothing is left to wait for on the host: the stream orders
// the work after it, as with NCCL). A call that fails after others of the
// same operation started leaves them to the process group, which completes
// them before their buffers go.

namespace {

class Starter {
 public:
  Starter(weft_comm_t* comm, PendingOp& op, const at::Tensor& any, std::vector<std::shared_ptr<PendingOp>>* orphans,
          std::mutex* orphansMu, std::shared_ptr<PendingOp> self)
      : comm_(comm), op_(op), orphans_(orphans), orphansMu_(orphansMu), self_(std::move(self)) {
#if WEFT_TORCH_HAVE_CUDA
    if (any.defined() && isCuda(any)) {
      onStream_ = true;
      guard_.emplace(any.device());
      stream_ = reinterpret_cast<struct CUstream_st*>(c10::cuda::getCurrentCUDAStream(any.device().index()).stream());
    }
#else
    (void)any;
#endif
  }
  Starter(const Starter&) = delete;
  Starter& operator=(const Starter&) = delete;

  bool onStream() const { return onStream_; }

  void send(const at::Tensor& t, int peer, int tag) {
    weft_request_t* r = nullptr;
    if (onStream_)
      done(weft_send_on_stream(comm_, t.data_ptr(), nbytes(t), peer, tag, stream_), "weft_send_on_stream");
    else
      started(weft_isend(comm_, t.data_ptr(), nbytes(t), peer, tag, &r), r, "weft_isend");
  }
  void recv(const at::Tensor& t, int peer, int tag) {
    weft_request_t* r = nullptr;
    if (onStream_)
      done(weft_recv_on_stream(comm_, t.data_ptr(), nbytes(t), peer, tag, stream_), "weft_recv_on_stream");
    else
      started(weft_irecv(comm_, t.data_ptr(), nbytes(t), peer, tag, &r), r, "weft_irecv");
  }
  void bcast(const at::Tensor& t, int root) {
    weft_request_t* r = nullptr;
    if (onStream_)
      done(weft_bcast_on_stream(comm_, t.data_ptr(), nbytes(t), root, stream_), "weft_bcast_on_stream");
    else
      started(weft_ibcast(comm_, t.data_ptr(), nbytes(t), root, &r), r, "weft_ibcast");
  }
  void allreduce(const at::Tensor& in, const at::Tensor& out, weft_dtype_t dt, weft_op_t rop) {
    weft_request_t* r = nullptr;
    size_t n = static_cast<size_t>(in.numel());
    if (onStream_)
      done(weft_allreduce_on_stream(comm_, in.data_ptr(), out.data_ptr(), n, dt, rop, stream_),
           "weft_allreduce_on_stream");
    else
      started(weft_iallreduce(comm_, in.data_ptr(), out.data_ptr(), n, dt, rop, &r), r, "weft_iallreduce");
  }
  // In place at root; other ranks' tensors are only read.
  void reduce(const at::Tensor& t, weft_dtype_t dt, weft_op_t rop, int root, int rank) {
    weft_request_t* r = nullptr;
    size_t n = static_cast<size_t>(t.numel());
    if (onStream_) {
      // No stream-ordered reduce in weft: an allreduce, whose result
      // non-root ranks drop into a scratch buffer.
      at::Tensor out = rank == root ? t : scratch(op_, t, t.numel());
      done(weft_allreduce_on_stream(comm_, t.data_ptr(), out.data_ptr(), n, dt, rop, stream_),
           "weft_allreduce_on_stream");
    } else {
      started(weft_ireduce(comm_, t.data_ptr(), rank == root ? t.data_ptr() : nullptr, n, dt, rop, root, &r), r,
              "weft_ireduce");
    }
  }
  void allgather(const at::Tensor& in, const at::Tensor& out) {
    weft_request_t* r = nullptr;
    if (onStream_)
      done(weft_allgather_on_stream(comm_, in.data_ptr(), out.data_ptr(), nbytes(in), stream_),
           "weft_allgather_on_stream");
    else
      started(weft_iallgather(comm_, in.data_ptr(), out.data_ptr(), nbytes(in), &r), r, "weft_iallgather");
  }
  void reduceScatter(const at::Tensor& in, const at::Tensor& out, weft_dtype_t dt, weft_op_t rop) {
    weft_request_t* r = nullptr;
    size_t n = static_cast<size_t>(out.numel());
    if (onStream_)
      done(weft_reduce_scatter_on_stream(comm_, in.data_ptr(), out.data_ptr(), n, dt, rop, stream_),
           "weft_reduce_scatter_on_stream");
    else
      started(weft_ireduce_scatter(comm_, in.data_ptr(), out.data_ptr(), n, dt, rop, &r), r,
              "weft_ireduce_scatter");
  }
  void alltoall(const at::Tensor& in, const at::Tensor& out, size_t bytesPerRank) {
    weft_request_t* r = nullptr;
    if (onStream_)
      done(weft_alltoall_on_stream(comm_, in.data_ptr(), out.data_ptr(), bytesPerRank, stream_),
           "weft_alltoall_on_stream");
    else
      started(weft_ialltoall(comm_, in.data_ptr(), out.data_ptr(), bytesPerRank, &r), r, "weft_ialltoall");
  }
  // recv: the root's size x bytesPerRank bytes; nullptr off the root.
  void gather(const at::Tensor& in, void* recv, size_t bytesPerRank, int root) {
    weft_request_t* r = nullptr;
    if (onStream_)
      done(weft_gather_on_stream(comm_, in.data_ptr(), recv, bytesPerRank, root, stream_), "weft_gather_on_stream");
    else
      started(weft_igather(comm_, in.data_ptr(), recv, bytesPerRank, root, &r), r, "weft_igather");
  }
  // send: the root's size x bytesPerRank bytes; nullptr off the root.
  void scatter(const void* send, const at::Tensor& out, size_t bytesPerRank, int root) {
    weft_request_t* r = nullptr;
    if (onStream_)
      done(weft_scatter_on_stream(comm_, send, out.data_ptr(), bytesPerRank, root, stream_),
           "weft_scatter_on_stream");
    else
      started(weft_iscatter(comm_, send, out.data_ptr(), bytesPerRank, root, &r), r, "weft_iscatter");
  }
  // Byte counts and offsets per rank (weft reads them during the call only).
  void alltoallv(const at::Tensor& in, const std::vector<size_t>& sb, const std::vector<size_t>& sd,
                 const at::Tensor& out, const std::vector<size_t>& rb, const std::vector<size_t>& rd) {
    weft_request_t* r = nullptr;
    if (onStream_)
      done(weft_alltoallv_on_stream(comm_, in.data_ptr(), sb.data(), sd.data(), out.data_ptr(), rb.data(), rd.data(),
                                    stream_),
           "weft_alltoallv_on_stream");
    else
      started(weft_ialltoallv(comm_, in.data_ptr(), sb.data(), sd.data(), out.data_ptr(), rb.data(), rd.data(), &r),
              r, "weft_ialltoallv");
  }

 private:
  // r by reference: it is read after the call that sets it has run (the
  // order of evaluation of one call's arguments is unspecified).
  void started(int rc, weft_request_t*& r, const char* call) {
    if (rc == WEFT_SUCCESS) {
      op_.reqs.push_back(r);
      return;
    }
    raise(rc, call);
  }
  void done(int rc, const char* call) {
    if (rc != WEFT_SUCCESS)
      raise(rc, call);
  }
  [[noreturn]] void raise(int rc, const char* call) {
    std::string why = std::string(call) + " on rank " + rankStr(op_.rank) + ": " + weftWhy(rc, comm_);
    if (!op_.reqs.empty()) {
      // Requests of this operation already in flight hold its buffers:
      // the process group completes them (their result is dropped).
      op_.finish.clear();
      std::lock_guard<std::mutex> lk(*orphansMu_);
      orphans_->push_back(self_);
    }
    fail(op_.name, why);
  }

  weft_comm_t* comm_;
  PendingOp& op_;
  std::vector<std::shared_ptr<PendingOp>>* orphans_;
  std::mutex* orphansMu_;
  std::shared_ptr<PendingOp> self_;
  bool onStream_ = false;
  struct CUstream_st* stream_ = nullptr;
#if WEFT_TORCH_HAVE_CUDA
  c10::optional<c10::cuda::CUDAGuard> guard_;
#endif
};

}  // namespace

#define WEFT_STARTER(op, any) Starter st(comm_, *(op), (any), &pending_, &pendingMu_, (op))

// ============================================================== operations

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::broadcast(std::vector<at::Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
  const std::string name = "broadcast";
  checkOne(name, tensors);
  checkRoot(name, opts.rootRank, getSize());
  if (opts.rootTensor != 0)
    fail(name, "rootTensor must be 0 (one tensor per rank)");
  auto op = newOp(name);
  int root = static_cast<int>(opts.rootRank);
  at::Tensor buf = stage(*op, tensors[0], getRank() == root ? Use::In : Use::Out);
  WEFT_STARTER(op, buf);
  st.bcast(buf, root);
  op->outputs = tensors;
  return launch(op, c10d::OpType::BROADCAST, "weft:broadcast", tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  const std::string name = "allreduce";
  checkOne(name, tensors);
  weft_dtype_t dt = weftDtype(name, tensors[0].scalar_type());
  weft_op_t rop = weftOp(name, opts.reduceOp, tensors[0].scalar_type());
  auto op = newOp(name);
  at::Tensor buf = stage(*op, tensors[0], Use::InOut);
  WEFT_STARTER(op, buf);
  st.allreduce(buf, buf, dt, rop);
  op->outputs = tensors;
  return launch(op, c10d::OpType::ALLREDUCE, "weft:all_reduce", tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                     const c10d::AllreduceCoalescedOptions& opts) {
  const std::string name = "allreduce_coalesced";
  checkTensors(name, tensors);
  std::vector<weft_dtype_t> dts;
  std::vector<weft_op_t> rops;
  for (const auto& t : tensors) {
    dts.push_back(weftDtype(name, t.scalar_type()));
    rops.push_back(weftOp(name, opts.reduceOp, t.scalar_type()));
  }
  auto op = newOp(name);
  // One allreduce per tensor, all in flight together: tensors may differ in
  // dtype, and weft pipelines them anyway.
  WEFT_STARTER(op, tensors.empty() ? at::Tensor() : tensors[0]);
  for (size_t i = 0; i < tensors.size(); i++) {
    at::Tensor buf = stage(*op, tensors[i], Use::InOut);
    st.allreduce(buf, buf, dts[i], rops[i]);
  }
  op->outputs = tensors;
  return launch(op, c10d::OpType::ALLREDUCE_COALESCED, "weft:allreduce_coalesced", tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::reduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::ReduceOptions& opts) {
  const std::string name = "reduce";
  checkOne(name, tensors);
  checkRoot(name, opts.rootRank, getSize());
  if (opts.rootTensor != 0)
    fail(name, "rootTensor must be 0 (one tensor per rank)");
  weft_dtype_t dt = weftDtype(name, tensors[0].scalar_type());
  weft_op_t rop = weftOp(name, opts.reduceOp, tensors[0].scalar_type());
  int root = static_cast<int>(opts.rootRank);
  auto op = newOp(name);
  at::Tensor buf = stage(*op, tensors[0], getRank() == root ? Use::InOut : Use::In);
  WEFT_STARTER(op, buf);
  st.reduce(buf, dt, rop, root, getRank());
  op->outputs = tensors;
  return launch(op, c10d::OpType::REDUCE, "weft:reduce", tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllgatherOptions&) {
  const std::string name = "allgather";
  checkOne(name, inputs);
  if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != getSize())
    fail(name, "expects one output list of " + std::to_string(getSize()) + " tensors");
  checkTensors(name, outputs[0]);
  for (const auto& o : outputs[0])
    checkSameKind(name, inputs[0], o, "an output tensor");
  auto op = newOp(name);
  at::Tensor in = stage(*op, inputs[0], Use::In);
  const int64_t n = in.numel();
  at::Tensor flat = scratch(*op, in, n * getSize());
  WEFT_STARTER(op, in);
  st.allgather(in, flat);
  std::vector<at::Tensor> outs = outputs[0];
  op->finish.push_back([outs, flat, n]() mutable {
    for (size_t r = 0; r < outs.size(); r++)
      outs[r].copy_(flat.narrow(0, static_cast<int64_t>(r) * n, n).view(outs[r].sizes()));
  });
  op->outputs = outs;
  return launch(op, c10d::OpType::ALLGATHER, "weft:all_gather", inputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::AllgatherOptions&) {
  const std::string name = "_allgather_base";
  checkTensors(name, {input, output});
  if (output.scalar_type() != input.scalar_type())
    fail(name, std::string("output dtype ") + c10::toString(output.scalar_type()) + " differs from input dtype " +
                   c10::toString(input.scalar_type()));
  if (output.numel() != input.numel() * getSize())
    fail(name, "output has " + std::to_string(output.numel()) + " elements, expected " +
                   std::to_string(input.numel() * getSize()) + " (input x group size)");
  auto op = newOp(name);
  at::Tensor in = stage(*op, input, Use::In);
  at::Tensor out = stage(*op, output, Use::Out);
  WEFT_STARTER(op, in);
  st.allgather(in, out);
  op->outputs = {output};
  return launch(op, c10d::OpType::_ALLGATHER_BASE, "weft:all_gather_into_tensor", {input});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) {
  const std::string name = "allgather_coalesced";
  checkTensors(name, inputs);
  // outputLists[r][k] receives rank r's inputs[k].
  if (static_cast<int>(outputLists.size()) != getSize())
    fail(name, "expects " + std::to_string(getSize()) + " output lists (one per rank), got " +
                   std::to_string(outputLists.size()));
  for (const auto& l : outputLists) {
    if (l.size() != inputs.size())
      fail(name, "each output list must hold " + std::to_string(inputs.size()) + " tensors (one per input)");
    checkTensors(name, l);
    for (size_t k = 0; k < l.size(); k++)
      checkSameKind(name, inputs[k], l[k], "an output tensor");
  }
  auto op = newOp(name);
  WEFT_STARTER(op, inputs.empty() ? at::Tensor() : inputs[0]);
  for (size_t k = 0; k < inputs.size(); k++) {
    at::Tensor in = stage(*op, inputs[k], Use::In);
    const int64_t n = in.numel();
    at::Tensor flat = scratch(*op, in, n * getSize());
    st.allgather(in, flat);
    std::vector<at::Tensor> outs;
    for (auto& l : outputLists)
      outs.push_back(l[k]);
    op->finish.push_back([outs, flat, n]() mutable {
      for (size_t r = 0; r < outs.size(); r++)
        outs[r].copy_(flat.narrow(0, static_cast<int64_t>(r) * n, n).view(outs[r].sizes()));
    });
  }
  for (auto& l : outputLists)
    op->outputs.insert(op->outputs.end(), l.begin(), l.end());
  return launch(op, c10d::OpType::ALLGATHER_COALESCED, "weft:all_gather_coalesced", inputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                        std::vector<at::Tensor>& inputs,
                                                        const c10d::GatherOptions& opts) {
  const std::string name = "gather";
  checkOne(name, inputs);
  checkRoot(name, opts.rootRank, getSize());
  const int root = static_cast<int>(opts.rootRank);
  const int rank = getRank();
  if (rank == root) {
    if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != getSize())
      fail(name, "the root expects one output list of " + std::to_string(getSize()) + " tensors");
    checkTensors(name, outputs[0]);
    for (const auto& o : outputs[0])
      checkSameKind(name, inputs[0], o, "an output tensor");
  } else if (!outputs.empty()) {
    fail(name, "only the root (rank " + std::to_string(root) + ") passes output tensors");
  }
  auto op = newOp(name);
  at::Tensor in = stage(*op, inputs[0], Use::In);
  // weft_igather into one buffer at the root, copied into the output list
  // on completion (as allgather).
  WEFT_STARTER(op, in);
  if (rank == root) {
    const int64_t n = in.numel();
    at::Tensor flat = scratch(*op, in, n * getSize());
    st.gather(in, flat.data_ptr(), nbytes(in), root);
    std::vector<at::Tensor> outs = outputs[0];
    op->finish.push_back([outs, flat, n]() mutable {
      for (size_t r = 0; r < outs.size(); r++)
        outs[r].copy_(flat.narrow(0, static_cast<int64_t>(r) * n, n).view(outs[r].sizes()));
    });
    op->outputs = outs;
  } else {
    st.gather(in, nullptr, nbytes(in), root);
  }
  return launch(op, c10d::OpType::GATHER, "weft:gather", inputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::scatter(std::vector<at::Tensor>& outputs,
                                                         std::vector<std::vector<at::Tensor>>& inputs,
                                                         const c10d::ScatterOptions& opts) {
  const std::string name = "scatter";
  checkOne(name, outputs);
  checkRoot(name, opts.rootRank, getSize());
  const int root = static_cast<int>(opts.rootRank);
  const int rank = getRank();
  if (rank == root) {
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != getSize())
      fail(name, "the root expects one input list of " + std::to_string(getSize()) + " tensors");
    checkTensors(name, inputs[0]);
    for (const auto& i : inputs[0])
      checkSameKind(name, outputs[0], i, "an input tensor");
  } else if (!inputs.empty()) {
    fail(name, "only the root (rank " + std::to_string(root) + ") passes input tensors");
  }
  auto op = newOp(name);
  at::Tensor out = stage(*op, outputs[0], Use::Out);
  // weft_iscatter from the root's input list side by side in one buffer.
  at::Tensor in;
  if (rank == root) {
    std::vector<at::Tensor> flat;
    for (const auto& i : inputs[0])
      flat.push_back(i.reshape({-1}));
    in = at::cat(flat);
    op->keep.push_back(in);
  }
  WEFT_STARTER(op, out);
  st.scatter(rank == root ? in.data_ptr() : nullptr, out, nbytes(out), root);
  op->outputs = outputs;
  std::vector<at::Tensor> ins = rank == root ? inputs[0] : std::vector<at::Tensor>();
  return launch(op, c10d::OpType::SCATTER, "weft:scatter", ins);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                                const c10d::ReduceScatterOptions& opts) {
  const std::string name = "reduce_scatter";
  checkOne(name, outputs);
  if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != getSize())
    fail(name, "expects one input list of " + std::to_string(getSize()) + " tensors");
  checkTensors(name, inputs[0]);
  for (const auto& i : inputs[0])
    checkSameKind(name, outputs[0], i, "an input tensor");
  weft_dtype_t dt = weftDtype(name, outputs[0].scalar_type());
  weft_op_t rop = weftOp(name, opts.reduceOp, outputs[0].scalar_type());
  auto op = newOp(name);
  // weft reduces one buffer of size x count: the inputs side by side.
  std::vector<at::Tensor> flat;
  for (const auto& i : inputs[0])
    flat.push_back(i.reshape({-1}));
  at::Tensor in = at::cat(flat);
  op->keep.push_back(in);
  at::Tensor out = stage(*op, outputs[0], Use::Out);
  WEFT_STARTER(op, out);
  st.reduceScatter(in, out, dt, rop);
  op->outputs = outputs;
  return launch(op, c10d::OpType::REDUCE_SCATTER, "weft:reduce_scatter", inputs[0]);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                      const c10d::ReduceScatterOptions& opts) {
  const std::string name = "_reduce_scatter_base";
  checkTensors(name, {input, output});
  if (output.scalar_type() != input.scalar_type())
    fail(name, std::string("output dtype ") + c10::toString(output.scalar_type()) + " differs from input dtype " +
                   c10::toString(input.scalar_type()));
  if (input.numel() != output.numel() * getSize())
    fail(name, "input has " + std::to_string(input.numel()) + " elements, expected " +
                   std::to_string(output.numel() * getSize()) + " (output x group size)");
  weft_dtype_t dt = weftDtype(name, output.scalar_type());
  weft_op_t rop = weftOp(name, opts.reduceOp, output.scalar_type());
  auto op = newOp(name);
  at::Tensor in = stage(*op, input, Use::In);
  at::Tensor out = stage(*op, output, Use::Out);
  WEFT_STARTER(op, in);
  st.reduceScatter(in, out, dt, rop);
  op->outputs = {output};
  return launch(op, c10d::OpType::_REDUCE_SCATTER_BASE, "weft:reduce_scatter_tensor", {input});
}

namespace {

// Bytes per dim-0 row (the unit of torch's split sizes).
size_t rowBytes(const at::Tensor& t) {
  if (t.dim() == 0 || t.size(0) == 0)
    return t.dim() == 0 ? static_cast<size_t>(t.element_size()) : 0;
  return nbytes(t) / static_cast<size_t>(t.size(0));
}

void checkSplits(const std::string& op, const std::vector<int64_t>& s, const at::Tensor& t, int size,
                 const char* what) {
  if (s.empty()) {
    if (t.dim() == 0 || t.size(0) % size != 0)
      fail(op, std::string(what) + " tensor's first dimension must divide by the group size " + std::to_string(size));
    return;
  }
  if (static_cast<int>(s.size()) != size)
    fail(op, std::string(what) + " split sizes: " + std::to_string(s.size()) + " given, expected " +
                 std::to_string(size));
  int64_t sum = 0;
  for (int64_t v : s) {
    if (v < 0)
      fail(op, std::string(what) + " split sizes must not be negative");
    sum += v;
  }
  if (t.dim() == 0 || sum != t.size(0))
    fail(op, std::string(what) + " split sizes add up to " + std::to_string(sum) + ", not the first dimension " +
                 std::to_string(t.dim() ? t.size(0) : 0));
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                               std::vector<int64_t>& outputSplitSizes,
                                                               std::vector<int64_t>& inputSplitSizes,
                                                               const c10d::AllToAllOptions&) {
  const std::string name = "alltoall_base";
  const int size = getSize();
  checkTensors(name, {input, output});
  if (output.scalar_type() != input.scalar_type())
    fail(name, std::string("output dtype ") + c10::toString(output.scalar_type()) + " differs from input dtype " +
                   c10::toString(input.scalar_type()));
  checkSplits(name, inputSplitSizes, input, size, "input");
  checkSplits(name, outputSplitSizes, output, size, "output");
  auto op = newOp(name);
  at::Tensor in = stage(*op, input, Use::In);
  at::Tensor out = stage(*op, output, Use::Out);
  // No split sizes: equal blocks on every rank, weft_alltoall. Split sizes
  // (even equal ones): weft_alltoallv. The choice must not depend on the
  // sizes: a rank whose splits happen to be equal cannot tell whether its
  // peers' are, and weft_alltoall on some ranks against weft_alltoallv on
  // others never matches.
  const bool split = !(inputSplitSizes.empty() && outputSplitSizes.empty());
  std::vector<size_t> sb(size), sd(size), rb(size), rd(size);  // alltoallv: bytes and offsets per rank
  if (!split) {
    if (nbytes(in) != nbytes(out))
      fail(name, "without split sizes input and output must have the same size (" + std::to_string(nbytes(in)) +
                     " and " + std::to_string(nbytes(out)) + " bytes)");
  } else {
    const size_t inRow = rowBytes(in), outRow = rowBytes(out);
    auto rows = [size](const std::vector<int64_t>& s, const at::Tensor& t, int r) -> int64_t {
      return s.empty() ? t.size(0) / size : s[r];
    };
    size_t inOff = 0, outOff = 0;
    for (int r = 0; r < size; r++) {
      sd[r] = inOff;
      sb[r] = static_cast<size_t>(rows(inputSplitSizes, in, r)) * inRow;
      inOff += sb[r];
      rd[r] = outOff;
      rb[r] = static_cast<size_t>(rows(outputSplitSizes, out, r)) * outRow;
      outOff += rb[r];
    }
    const int rank = getRank();
    if (sb[rank] != rb[rank])
      fail(name, "rank " + std::to_string(rank) + " sends itself " + std::to_string(sb[rank]) +
                     " bytes but expects " + std::to_string(rb[rank]));
    // weft_alltoallv has no in-place form: an input sharing memory with the
    // output is sent from a copy.
    auto addr = [](const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); };
    if (nbytes(in) && nbytes(out) && addr(in) < addr(out) + nbytes(out) && addr(out) < addr(in) + nbytes(in)) {
      in = in.clone();
      op->keep.push_back(in);
    }
  }
  WEFT_STARTER(op, in);
  if (split)
    st.alltoallv(in, sb, sd, out, rb, rd);
  else
    st.alltoall(in, out, nbytes(in) / size);
  op->outputs = {output};
  return launch(op, c10d::OpType::ALLTOALL_BASE, "weft:all_to_all", {input});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::alltoall(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllToAllOptions&) {
  const std::string name = "alltoall";
  const int size = getSize();
  if (static_cast<int>(inputs.size()) != size || static_cast<int>(outputs.size()) != size)
    fail(name, "expects " + std::to_string(size) + " input and output tensors (got " + std::to_string(inputs.size()) +
                   " and " + std::to_string(outputs.size()) + ")");
  checkTensors(name, inputs);
  checkTensors(name, outputs);
  for (int r = 0; r < size; r++)
    if (inputs[r].scalar_type() != inputs[0].scalar_type() || outputs[r].scalar_type() != inputs[0].scalar_type())
      fail(name, "all tensors must have one dtype");
  const int rank = getRank();
  if (outputs[rank].numel() != inputs[rank].numel())
    fail(name, "rank " + std::to_string(rank) + " sends itself " + std::to_string(inputs[rank].numel()) +
                   " elements but expects " + std::to_string(outputs[rank].numel()));
  auto op = newOp(name);
  // Always weft_alltoallv: a rank whose blocks happen to be equal cannot
  // tell whether its peers' are, and weft_alltoall on some ranks against
  // weft_alltoallv on others would never match. The inputs go side by side
  // in one buffer; the output arrives in one buffer, copied into the output
  // list on completion.
  std::vector<at::Tensor> flat;
  for (const auto& i : inputs)
    flat.push_back(i.reshape({-1}));
  at::Tensor in = at::cat(flat);
  op->keep.push_back(in);
  const size_t esize = static_cast<size_t>(in.element_size());
  std::vector<size_t> sb(size), sd(size), rb(size), rd(size);
  std::vector<int64_t> outAt(size);
  size_t inOff = 0;
  int64_t outElems = 0;
  for (int r = 0; r < size; r++) {
    sd[r] = inOff;
    sb[r] = static_cast<size_t>(inputs[r].numel()) * esize;
    inOff += sb[r];
    outAt[r] = outElems;
    rd[r] = static_cast<size_t>(outElems) * esize;
    rb[r] = static_cast<size_t>(outputs[r].numel()) * esize;
    outElems += outputs[r].numel();
  }
  at::Tensor out = scratch(*op, in, outElems);
  WEFT_STARTER(op, in);
  st.alltoallv(in, sb, sd, out, rb, rd);
  std::vector<at::Tensor> outs = outputs;
  op->finish.push_back([outs, out, outAt]() mutable {
    for (size_t r = 0; r < outs.size(); r++)
      outs[r].copy_(out.narrow(0, outAt[r], outs[r].numel()).view(outs[r].sizes()));
  });
  op->outputs = outputs;
  return launch(op, c10d::OpType::ALLTOALL, "weft:all_to_all", inputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  const std::string name = "send to rank " + std::to_string(dstRank) + " (tag " + std::to_string(tag) + ")";
  checkOne(name, tensors);
  checkUserTag(name, tag);
  if (dstRank < 0 || dstRank >= getSize())
    fail(name, "destination rank out of range (group of " + std::to_string(getSize()) + ")");
  auto op = newOp(name);
  at::Tensor buf = stage(*op, tensors[0], Use::In);
  WEFT_STARTER(op, buf);
  st.send(buf, dstRank, tag);
  return launch(op, c10d::OpType::SEND, "weft:send", tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  const std::string name = "recv from rank " + std::to_string(srcRank) + " (tag " + std::to_string(tag) + ")";
  checkOne(name, tensors);
  checkUserTag(name, tag);
  if (srcRank < 0 || srcRank >= getSize())
    fail(name, "source rank out of range (group of " + std::to_string(getSize()) + ")");
  auto op = newOp(name);
  at::Tensor buf = stage(*op, tensors[0], Use::Out);
  WEFT_STARTER(op, buf);
  st.recv(buf, srcRank, tag);
  op->outputs = tensors;
  return launch(op, c10d::OpType::RECV, "weft:recv", tensors, srcRank);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::recvAnysource(std::vector<at::Tensor>&, int) {
  throw std::runtime_error(
      "weft backend: recv from any source is not supported (weft matches a receive to one peer: pass src)");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::barrier(const c10d::BarrierOptions&) {
  auto op = newOp("barrier");
  weft_request_t* r = nullptr;
  check(weft_ibarrier(comm_, &r), "barrier", "weft_ibarrier");
  op->reqs.push_back(r);
  return launch(op, c10d::OpType::BARRIER, "weft:barrier", {});
}

}  // namespace weft_torch

// ============================================================== Python

namespace py = pybind11;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using weft_torch::ProcessGroupWeft;
  m.doc() = "weft's torch.distributed backend (C++ part); import weft_torch, not this module";
  // The base class must be registered with pybind11 before ours derives
  // from it: torch.distributed registers it.
  py::module_::import("torch.distributed");
  py::class_<ProcessGroupWeft, c10::intrusive_ptr<ProcessGroupWeft>, weft_torch::PGBase>(m, "ProcessGroupWeft")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout) {
             return c10::make_intrusive<ProcessGroupWeft>(store, rank, size, timeout);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def("abort", &ProcessGroupWeft::abort, py::call_guard<py::gil_scoped_release>(),
           "weft_comm_abort: pending and later operations of this group fail at once")
      .def("last_error", &ProcessGroupWeft::lastError, "weft_comm_last_error of the group's comm")
      .def_property_readonly("weft_timeout", &ProcessGroupWeft::weftTimeout,
                             "WEFT_TIMEOUT (seconds) the group's comm was made with");
  m.attr("WEFT_VERSION") = std::to_string(WEFT_VERSION_MAJOR) + "." + std::to_string(WEFT_VERSION_MINOR) + "." +
                           std::to_string(WEFT_VERSION_PATCH);
  m.attr("BACKEND_API") = WEFT_TORCH_BACKEND_API ? "c10d::Backend" : "c10d::ProcessGroup";
  m.attr("CUDA") = static_cast<bool>(WEFT_TORCH_HAVE_CUDA);
}
