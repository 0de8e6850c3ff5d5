// ProcessGroupWeft: the "weft" backend of torch.distributed.
//
// One weft comm per process group, made by weft_get_unique_id (rank 0, which
// puts the 128-byte id in the group's store) and weft_comm_init (every rank).
// Every operation is started with weft's non-blocking calls (weft_isend,
// weft_iallreduce, ...) and returns a WorkWeft that completes them with
// weft_test / weft_wait: weft progresses only inside weft calls, so it is
// Work.wait() (or isCompleted()) that moves the data of an async operation.
//
// torch 1.13 (here, from Debian) derives backends from c10d::ProcessGroup;
// torch >= 2.0 from c10d::Backend, with the same operation signatures. The
// choice is made on TORCH_VERSION_MAJOR; WEFT_TORCH_FORCE_BACKEND_API selects
// the 2.0 form on 1.13 headers that carry Backend.hpp (a compile check only).
// The adapter uses only weft's public header, weft.h.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#if TORCH_VERSION_MAJOR < 1 || (TORCH_VERSION_MAJOR == 1 && TORCH_VERSION_MINOR < 13)
#error "the weft backend needs torch >= 1.13 (c10d::Work in Work.hpp)"
#endif

#if TORCH_VERSION_MAJOR >= 2 || defined(WEFT_TORCH_FORCE_BACKEND_API)
#define WEFT_TORCH_BACKEND_API 1
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#define WEFT_TORCH_BACKEND_API 0
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

#include "weft.h"

namespace weft_torch {

#if WEFT_TORCH_BACKEND_API
using PGBase = c10d::Backend;
#else
using PGBase = c10d::ProcessGroup;
#endif

// The weft requests of one torch operation, the tensors they read and write
// (kept alive until the requests completed, whatever happens to the Work),
// and what to do once they all completed (copy staged results back into the
// user's tensors). Shared by the WorkWeft and by the process group, which
// completes the operations whose Work was dropped unwaited and, at
// destruction, every one still pending.
struct PendingOp {
  PendingOp(weft_comm_t* comm, int rank, std::string name)
      : comm(comm), rank(rank), name(std::move(name)) {}

  // Completes what it can without blocking (weft_test); true once done.
  // Never blocks on mu: a thread already waiting in it makes this false.
  bool poll();
  // Blocks until every request completed (weft_waitall; WEFT_TIMEOUT bounds
  // each wait for progress) and the copy-backs ran.
  void waitAll();
  // Polls until done or the deadline; false at the deadline (still pending).
  bool waitUntil(std::chrono::steady_clock::time_point deadline);

  bool isDone() const { return done.load(std::memory_order_acquire); }
  // "" on success, else weft's text with the operation and rank.
  std::string error() const;
  int errorCode() const;

  weft_comm_t* const comm;
  const int rank;
  const std::string name;           // "allreduce", "recv from rank 2 (tag 0)", ...
  std::vector<weft_request_t*> reqs; // nullptr once completed (weft freed it)
  std::vector<at::Tensor> keep;     // buffers weft reads or writes
  std::vector<std::function<void()>> finish; // after success, in order
  std::vector<at::Tensor> outputs;  // Work::result()

 private:
  void fail(int rc, const char* where);  // records the first error (mu held)
  void finishLocked();                   // runs the copy-backs once (mu held)

  mutable std::mutex mu;
  std::atomic<bool> done{false};
  int err = WEFT_SUCCESS;
  std::string errText;
};

class WorkWeft : public c10d::Work {
 public:
  WorkWeft(std::shared_ptr<PendingOp> op, int rank, c10d::OpType type, const char* profilingTitle,
           const c10::optional<std::vector<at::Tensor>>& inputs, int sourceRank);
  ~WorkWeft() override;

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override;
  void synchronize() override {}
  // timeout 0 (kNoTimeout): until done, each wait for progress bounded by
  // WEFT_TIMEOUT; otherwise at most `timeout`, then RuntimeError with the
  // operation still pending (weft cannot cancel a started request).
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  // Completes the operation first (weft moves data only inside weft calls,
  // so a future nobody drives would never complete), then returns a
  // completed future (or one holding the error).
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  void settle();  // calls Work::finish once the op is done

  std::shared_ptr<PendingOp> op_;
  const int sourceRank_;
  std::once_flag settled_;
};

class ProcessGroupWeft : public PGBase {
 public:
  // Collective over the group: rank 0 makes the unique id and sets it in
  // `store`; the others get it (bounded by the store's timeout); all call
  // weft_comm_init. `timeout` becomes the comm's WEFT_TIMEOUT unless the user
  // set WEFT_TIMEOUT in the environment.
  ProcessGroupWeft(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                   std::chrono::milliseconds timeout);
  ~ProcessGroupWeft() override;

  const std::string getBackendName() const override { return "weft"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplitSizes,
                                               std::vector<int64_t>& inputSplitSizes,
                                               const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;

  // weft_comm_abort: every pending and later operation of this group fails
  // promptly (WEFT_ERR_ABORTED) and the peers' pipes to this rank break.
  void abort();
  // The weft comm's last error ("" if none), for tests and diagnostics.
  std::string lastError() const;
  // The WEFT_TIMEOUT this group's comm was made with (seconds, as text).
  const std::string& weftTimeout() const { return weftTimeout_; }

 private:
  // Starts nothing; the op to fill, after sweeping completed orphans.
  std::shared_ptr<PendingOp> newOp(std::string name);
  // Wraps op in a Work and remembers it until it completed.
  c10::intrusive_ptr<c10d::Work> launch(std::shared_ptr<PendingOp> op, c10d::OpType type, const char* title,
                                        const std::vector<at::Tensor>& inputs, int sourceRank = -1);
  // Throws RuntimeError naming op and weft's error when rc != WEFT_SUCCESS.
  void check(int rc, const std::string& op, const char* call) const;
  void sweep();

  weft_comm_t* comm_ = nullptr;
  std::string weftTimeout_;
  std::mutex pendingMu_;
  std::vector<std::shared_ptr<PendingOp>> pending_;
};

}  // namespace weft_torch
