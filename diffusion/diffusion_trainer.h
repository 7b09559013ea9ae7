#pragma once
// The DiT / MoH-DiT training step: DiT's train.py recipe (uniform t ~ U{0..T−1}, the hybrid loss MSE + VLB) or SiT's
// flow matching (t on the interpolant, the velocity / noise / score loss of diffusion/flow_matching.h), plus
// β·MoH load-balance loss. The loop (AdamW, EMA, checkpoints, resume, ranks, metrics) is core/train/train_loop.h; the
// task that joins them with the experiment's data is experiments/train_tasks.h.
#include <functional>
#include <string>

#include "core/platform/amp.h"
#include "core/train/train_loop.h"
#include "diffusion/dit.h"
#include "diffusion/flow_matching.h"
#include "diffusion/gaussian_diffusion.h"
#include "diffusion/repa.h"

namespace moh::diffusion {

/// The random draws of one DiT training step, in DiT's order: t ~ U{0..T−1} (B), the noise (B, C, H, W) and, when
/// drop_prob > 0, the class-dropout mask (B) bool. They are drawn for the global batch (B·world rows) from the global
/// CPU generator, whatever the device — its state is in every checkpoint, so a resumed GPU run does not replay
/// noise, and any device and process count draw the same numbers — and this rank's rows r, r + world, ... are
/// copied to `device`.
struct DiffusionDraws {
  at::Tensor t, noise, drop;
};
/// The training times of a global batch of G rows (drawn from the global CPU generator).
using TimeDraw = std::function<at::Tensor(int64_t global_batch)>;
DiffusionDraws draw_training_noise(const std::vector<int64_t>& local_shape, const TimeDraw& draw_t, double drop_prob,
                                   int rank, int world, const c10::Device& device);
/// DDPM's draws: t ~ U{0..num_steps−1}.
DiffusionDraws draw_training_noise(const std::vector<int64_t>& local_shape, int64_t num_steps, double drop_prob,
                                   int rank, int world, const c10::Device& device);
/// A flow process's draws: t (float32) by its t_sampling.
TimeDraw flow_time_draw(const FlowProcess& flow);

/// The forward/backward half of a DiT training step on clean data (B, C, H, W) with labels y: the draws above,
/// q_sample, forward under autocast, hybrid loss in fp32 + β·aux, scaled backward. The optimizer half is
/// finish_optimizer_step (core/train/optimizer.h). Data parallel (world > 1): data holds the rank's samples r, r +
/// world, ... of the global batch, so the step equals a single process's. With `repa` enabled, λ·REPA's projection loss
/// of the model's projected block tokens against the encoder's targets of the data is added (REPA train.py). Returns
/// loss, mse, vb, aux (and repa) (0-dim, on the device).
LossTensors diffusion_backward(DiT& model, const GaussianDiffusion& diffusion, const at::Tensor& data,
                               const at::Tensor& y, double beta, const RunContext& ctx, const GradScaler& scaler,
                               int rank = 0, int world = 1, const RepaTerm& repa = {});

/// The same half step for flow matching (SiT train.py): t, the noise and the class-dropout mask as above, x_t and u_t
/// on the path, forward under autocast on t itself, the loss of flow.training_losses on the first C output channels
/// (a learned-σ model's variance channels go untrained, as in SiT) + β·aux (+ λ·REPA of the data, REPA's SiT recipe).
/// Returns loss, mse, cosine, aux (and repa).
LossTensors flow_backward(DiT& model, const FlowProcess& flow, const at::Tensor& data, const at::Tensor& y, double beta,
                          const RunContext& ctx, const GradScaler& scaler, int rank = 0, int world = 1,
                          const RepaTerm& repa = {});

}  // namespace moh::diffusion
