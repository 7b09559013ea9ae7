#pragma once
// Data parallelism on LibTorch's own distributed engine (c10d): a process group joined through a TCPStore at
// MASTER_ADDR:MASTER_PORT (the torchrun / Slurm environment RunContext reads), Gloo on CPU tensors, NCCL on CUDA
// when this LibTorch has it. The trainers use it to start every rank from rank 0's weights, average gradients in
// buckets, sum metrics and gather samples. A world of one process needs no group: every call is then a no-op.
//
// Built when LibTorch ships the c10d + Gloo headers (MOH_WITH_C10D; Debian: libgloo-dev); otherwise a world size
// above one is a UserError naming what is missing.
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dist/rendezvous.h"
#include "core/platform/run_context.h"

namespace moh::dist {

/// Whether this build can join a process group.
bool available();

/// Whether this process has begun to meet the other ranks (the rendezvous of Group::join). From then on an input
/// error is every rank's and the first rank of each machine says it; before, it is this rank's own and it says it.
bool met_other_ranks();

/// The process group of a run (or a single-process stand-in).
/// Every collective hands the backend tensors on the backend's device(): the host for Gloo, the rank's GPU for NCCL
/// (which refuses host tensors). Callers pass tensors from anywhere; the group copies them over and back, and tensors
/// already on that device (gradients of a GPU model under NCCL) travel without a copy.
class Group {
 public:
  /// Joins the group described by ctx (rank, world) and MASTER_ADDR / MASTER_PORT; world 1 → a no-op group.
  /// The rendezvous (core/dist/rendezvous.h) refuses, with a UserError on every rank, ranks started for another world
  /// size, a rank taken twice, and any value of `agree` (the run's config hash, its starting step) that differs from
  /// rank 0's. Joining and each collective time out after MOH_DIST_TIMEOUT seconds (default 300); a rank that died
  /// makes the others fail with one line naming the lost ranks and their hosts instead of hanging.
  /// even_alone: a real c10d group for a world of one too, whose collectives go through the backend (a GPU machine
  /// with one GPU can check NCCL that way; a two-rank NCCL group needs two GPUs).
  static std::shared_ptr<Group> join(const RunContext& ctx, const Agreement& agree = {}, bool even_alone = false);
  virtual ~Group() = default;
  int rank() const { return rank_; }
  int world() const { return world_; }
  bool is_main() const { return rank_ == 0; }
  /// Where the backend wants the tensors of a collective (CPU for Gloo and the single-process group).
  const c10::Device& device() const { return device_; }
  /// The backend's name: "local", "gloo", "nccl" (or a test's fake).
  virtual std::string backend() const = 0;

  /// Sums each tensor over the ranks, in place (the tensors must have the same shapes on every rank).
  void allreduce_sum_(std::vector<at::Tensor>& tensors);
  /// Copies root's tensors to every rank, in place.
  void broadcast_(std::vector<at::Tensor>& tensors, int root = 0);
  /// Waits for every rank.
  virtual void barrier() = 0;

  /// Sums plain numbers over the ranks (metrics).
  std::vector<double> sum(const std::vector<double>& values);
  /// Rank 0's parameters and buffers on every rank.
  void broadcast_module(torch::nn::Module& module);
  /// Replaces each parameter's gradient by its mean over the ranks, reducing in flat buckets of ≈ bucket_bytes
  /// (all buckets in flight at once). Parameters without a gradient contribute zeros.
  void average_gradients(const std::vector<at::Tensor>& params, int64_t bucket_bytes = 25 << 20);
  /// Concatenates each rank's (n_r, ...) block along dim 0 in rank order (blocks may differ in length), in the
  /// block's own dtype (small things only: generator states, counts; samples go through per-rank files).
  at::Tensor gather_cat(const at::Tensor& block);

 protected:
  Group(int rank, int world, c10::Device device = c10::Device(c10::kCPU))
      : rank_(rank), world_(world), device_(device) {}
  /// Whether the collectives are the identity and skip the backend (a world of one without a process group).
  virtual bool alone() const { return world_ == 1; }
  /// The backend's operations: every tensor is on device() (the public calls above make sure of it).
  virtual void backend_allreduce_sum_(std::vector<at::Tensor>& tensors) = 0;
  virtual void backend_broadcast_(std::vector<at::Tensor>& tensors, int root) = 0;
  /// `t`'s values on device() (t itself when it is there already), and a backend tensor's values on `device`. A test
  /// group that simulates a device without data overrides both.
  virtual at::Tensor to_backend(const at::Tensor& t) { return t.device() == device_ ? t : t.to(device_); }
  virtual at::Tensor from_backend(const at::Tensor& t, const c10::Device& device) { return t.to(device); }
  int rank_, world_;
  c10::Device device_;

 private:
  // Runs `op` on backend copies of `tensors` and writes the results back into them where a copy was made.
  template <class Op>
  void on_backend(std::vector<at::Tensor>& tensors, Op&& op);
};

/// The generator states a checkpoint keeps: "cpu" (this rank's CPU generator) and, on a GPU, "cuda" (the device's);
/// with per_rank, every rank's as "cpu_ranks" / "cuda_ranks" (world, L) in rank order. A collective: all ranks call it.
std::map<std::string, at::Tensor> gather_rng_states(Group& group, const c10::Device& device, bool per_rank);

/// Sets this rank's generators (the CPU's and, on a GPU, the device's) at the start of a run. per_rank = false: every
/// rank keeps one common stream (rank 0's states from the checkpoint). per_rank = true: ranks draw independently — a
/// fresh run reseeds rank r > 0 with seed + 1000·r; a resumed run restores each rank's own states from
/// `cpu_ranks` / `cuda_ranks` when the world size is the same, else reseeds ranks r > 0 from (seed, r, step).
/// `rng` = the checkpoint's rng map, or null for a fresh run.
void restore_rank_rng(Group& group, const std::map<std::string, at::Tensor>* rng, uint64_t seed, int64_t step,
                      bool per_rank, const c10::Device& device = c10::Device(c10::kCPU));

}  // namespace moh::dist
