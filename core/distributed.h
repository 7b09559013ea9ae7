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

#include "core/run_context.h"

namespace moh::dist {

/// Whether this build can join a process group.
bool available();

/// The process group of a run (or a single-process stand-in).
class Group {
 public:
  /// Joins the group described by ctx (rank, world) and MASTER_ADDR / MASTER_PORT; world 1 → a no-op group.
  /// Collectives time out after MOH_DIST_TIMEOUT seconds (default 300): a rank that died makes the others fail with
  /// an error instead of hanging.
  static std::shared_ptr<Group> join(const RunContext& ctx);
  virtual ~Group() = default;
  int rank() const { return rank_; }
  int world() const { return world_; }
  bool is_main() const { return rank_ == 0; }

  /// Sums each tensor over the ranks, in place (the tensors must have the same shapes on every rank).
  virtual void allreduce_sum_(std::vector<at::Tensor>& tensors) = 0;
  /// Copies root's tensors to every rank, in place.
  virtual void broadcast_(std::vector<at::Tensor>& tensors, int root = 0) = 0;
  /// Waits for every rank.
  virtual void barrier() = 0;

  /// Sums plain numbers over the ranks (metrics).
  std::vector<double> sum(const std::vector<double>& values);
  /// Rank 0's parameters and buffers on every rank.
  void broadcast_module(torch::nn::Module& module);
  /// Replaces each parameter's gradient by its mean over the ranks, reducing in flat buckets of ≈ bucket_bytes
  /// (all buckets in flight at once). Parameters without a gradient contribute zeros.
  void average_gradients(const std::vector<at::Tensor>& params, int64_t bucket_bytes = 25 << 20);
  /// Concatenates each rank's (n_r, ...) block along dim 0 in rank order (blocks may differ in length).
  at::Tensor gather_cat(const at::Tensor& block);

 protected:
  Group(int rank, int world) : rank_(rank), world_(world) {}
  int rank_, world_;
};

/// Every rank's CPU generator state stacked in rank order, (world, L) uint8 (a collective: all ranks call it).
at::Tensor gather_rank_rng(Group& group);

/// Sets this rank's CPU generator at the start of a run. per_rank = false: every rank keeps one common stream
/// (rank 0's state from the checkpoint). per_rank = true: ranks draw independently — a fresh run reseeds rank r > 0
/// with seed + 1000·r; a resumed run restores each rank's own state from `cpu_ranks` when the world size is the same,
/// else reseeds ranks r > 0 from (seed, r, step). `rng` = the checkpoint's rng map, or null for a fresh run.
void restore_rank_rng(Group& group, const std::map<std::string, at::Tensor>* rng, uint64_t seed, int64_t step,
                      bool per_rank);

}  // namespace moh::dist
