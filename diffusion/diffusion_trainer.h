#pragma once
// The DiT / MoH-DiT task of the training loop (DiT train.py recipe): uniform t ~ U{0..T−1}, the hybrid loss
// (MSE + VLB) plus β·MoH load-balance loss, AdamW (DiT: lr 1e-4, no weight decay, constant), EMA when
// train.ema_decay > 0 (DiT: 0.9999, initialised as a copy). The loop (checkpoints, resume, ranks, metrics) is
// core/train_loop.h; the experiment's model and data are diffusion/dit_experiment.h.
#include <string>

#include "core/amp.h"
#include "core/train_loop.h"
#include "diffusion/diffusion_process.h"
#include "diffusion/dit.h"
#include "diffusion/dit_experiment.h"

namespace moh::diffusion {

/// Losses of one training step (batch means).
struct DiffusionStepLosses {
  double loss = 0, mse = 0, vb = 0, aux = 0;
};
/// The forward/backward half of a DiT training step on clean data x0 (B, C, H, W) with labels y: t ~ U{0..T−1},
/// noise and the class-dropout mask drawn in DiT's order, q_sample, forward under autocast, hybrid loss in fp32 +
/// β·aux, scaled backward. The optimizer half is finish_optimizer_step (core/amp.h). Data parallel (world > 1): x0
/// holds the rank's samples r, r + world, ... of the global batch; the draws are made for the whole global batch
/// (one common generator on every rank) and the rank's rows taken, so the step equals a single process's.
DiffusionStepLosses diffusion_backward(DiT& model, const GaussianDiffusion& diffusion, const at::Tensor& x0,
                                       const at::Tensor& y, double beta, const RunContext& ctx, const GradScaler& scaler,
                                       int rank = 0, int world = 1);

/// The DiT task for run_training().
std::unique_ptr<TrainTask> make_dit_task(const ExperimentConfig& cfg, const RunContext& ctx);

/// Result of a diffusion training run.
struct DiffusionTrainResult {
  std::string run_dir;
  int64_t steps = 0;
  double loss = 0;  ///< mean loss over the last logging window
  double seconds = 0;
};

/// Runs (or resumes) DiT training as configured.
DiffusionTrainResult train_diffusion(const ExperimentConfig& cfg, const TrainArgs& args);

}  // namespace moh::diffusion
