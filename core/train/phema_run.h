#pragma once
// Post-hoc EMA on disk: the snapshots a training run writes (RUN/phema/STEP/sigma_rel_S.safetensors, official
// tensor names, step / sigma_rel / gamma in each file's metadata) and the reconstruction of an EMA of any σ_rel from
// them (core/train/phema.h), written as a checkpoint that moh sample / moh eval / moh fid read like any other.
#include <cstdint>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include <memory>
#include <utility>

#include "core/io/safetensors.h"
#include "core/train/phema.h"
#include "core/train_config.h"

namespace moh::phema {

/// One snapshot file: the profile of `sigma_rel` (exponent `gamma`) at optimizer step `step`.
struct Snapshot {
  int64_t step = 0;
  double sigma_rel = 0, gamma = 0;
  std::string file;
};

/// Writes the tracked profiles at `step` (one map per σ_rel, in the order of `sigma_rels`) into
/// RUN/phema/<step, 7 digits>/ atomically; a snapshot of the same step is replaced.
void write_snapshot(const std::string& run_dir, int64_t step, const std::vector<double>& sigma_rels,
                    const std::vector<TensorMap>& profiles);

/// Every snapshot of a run, by step, then σ_rel. A run directory without any is a UserError.
std::vector<Snapshot> list_snapshots(const std::string& run_dir);

/// An EMA reconstructed from a run's snapshots.
struct Reconstruction {
  int64_t step = 0;  ///< the EMA's end point: the last snapshot step at or before the one asked for
  double sigma_rel = 0, gamma = 0;
  std::vector<Snapshot> used;        ///< every snapshot at or before `step`
  std::vector<double> coefficients;  ///< one per used snapshot, summing to 1
  TensorMap tensors;                 ///< Σ coefficient · snapshot, in the snapshots' dtypes
};

/// The EMA of `sigma_rel` at `step` (0 = the last snapshot) from the snapshots at or before it. UserErrors: no
/// snapshots, a step before the first snapshot, σ_rel outside the profiles' range.
Reconstruction reconstruct(const std::string& run_dir, double sigma_rel, int64_t step = 0);

/// Writes `r` as a run directory `out_dir` holding one checkpoint (model and EMA = the reconstruction, the run's
/// resolved config, no optimizer state) and phema_reconstruction.json (σ_rel, γ, step, snapshots, coefficients).
/// `out_dir` must not exist or be empty.
void write_reconstruction(const Reconstruction& r, const std::string& run_dir, const std::string& out_dir);

/// The post-hoc EMA of a training run: the tracked profiles of the model's floating-point tensors (official names),
/// their place in checkpoints (phema_S.safetensors beside ema.safetensors, for exact resume) and the snapshots.
class RunProfiles {
 public:
  RunProfiles(const PhemaConfig& cfg, const torch::nn::Module& model);
  /// The profiles of a checkpoint (a resumed run); a checkpoint without them is a UserError.
  void load(const std::string& checkpoint_dir);
  /// After the t-th optimizer step (t ≥ 1); `taken` as Tracker::update.
  void update(int64_t t, const at::Tensor& taken = {}) { tracker_->update(live_, t, taken); }
  /// The files a checkpoint holds for them: ("phema_S", tensors) per σ_rel.
  std::vector<std::pair<std::string, TensorMap>> checkpoint_files() const;
  /// Whether `step` is a snapshot step (a multiple of snapshot_every).
  bool due(int64_t step) const { return step > 0 && step % cfg_.snapshot_every == 0; }
  /// Writes the snapshot of `step` into RUN/phema/ (call on the writing rank only).
  void write(const std::string& run_dir, int64_t step) const;

 private:
  TensorMap profile_map(size_t k) const;
  PhemaConfig cfg_;
  std::vector<std::string> names_;
  std::vector<at::Tensor> live_;  // the model's tensors the profiles follow (views, not copies)
  TensorMap fixed_;               // integer buffers: written as the model holds them
  std::unique_ptr<Tracker> tracker_;
};

}  // namespace moh::phema
