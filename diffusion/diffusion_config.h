#pragma once
// The diffusion sections of an experiment file (`diffusion:`, `sampling:`) and their choices (VAE, sampler, CFG
// channels, CUDA graphs), declared by the diffusion library (experiments/experiment_config.h holds the whole file).
// The sampler names come from the sampler records (diffusion/sampler.h): adding a sampler is one record there.
#include <cstdint>
#include <string>
#include <vector>

#include "core/config_schema.h"
#include "core/train_config.h"

namespace moh {

/// Latent space of a diffusion model: `none` = pixel-space diffusion.
enum class VaeKind { none, sd, vavae };
const config::EnumTable<VaeKind>& enum_table(VaeKind);

/// Reverse-process sampler: DDPM / DDIM over a respaced chain, a probability-flow ODE solver (DPM-Solver++(2M),
/// Euler, Heun) over the base chain; for flow models Euler, Heun, adaptive Dormand–Prince (dopri5) or the SDE
/// (Euler–Maruyama) on the interpolant's time. The records in diffusion/sampler.h say which runs on which objective.
enum class SamplerKind { ddpm, ddim, dpmpp_2m, euler, heun, dopri5, sde };
const config::EnumTable<SamplerKind>& enum_table(SamplerKind);

/// Output channels classifier-free guidance is applied to: `three` = the first 3 (DiT's code, needed for parity with
/// published FIDs), `all` = every ε channel (the standard formulation, diffusers).
enum class CfgChannels { three, all };
const config::EnumTable<CfgChannels>& enum_table(CfgChannels);

/// Whether sampling replays its network evaluations as CUDA graphs: `automatic` ("auto") on a GPU with a CUDA
/// LibTorch where the forward can be captured, else eager; `off` always eager.
enum class CudaGraphMode { automatic, off };
const config::EnumTable<CudaGraphMode>& enum_table(CudaGraphMode);

/// What the network is trained for: DDPM's ε prediction on a discrete chain (DiT) or flow matching (SiT). Its values
/// are defined beside their records in diffusion/objective.h; a value-initialised Objective is the first (ddpm).
enum class Objective : int;
const config::EnumTable<Objective>& enum_table(Objective);

/// The interpolant of flow matching: linear (α = t, σ = 1 − t) or GVP (α = sin(πt/2), σ = cos(πt/2)).
enum class FlowPath { linear, gvp };
const config::EnumTable<FlowPath>& enum_table(FlowPath);

/// What a flow model predicts.
enum class FlowPrediction { velocity, noise, score };
const config::EnumTable<FlowPrediction>& enum_table(FlowPrediction);

/// How flow training draws t: uniform, or logit-normal sigmoid(N(m, s²)) (LightningDiT's use_lognorm).
enum class TimeSampling { uniform, lognormal };
const config::EnumTable<TimeSampling>& enum_table(TimeSampling);

/// Flow training loss: MSE, or MSE + LightningDiT's velocity-direction term 1 − cos.
enum class FlowLoss { mse, mse_cosine };
const config::EnumTable<FlowLoss>& enum_table(FlowLoss);

/// The flow-matching keys of `diffusion:` (read when objective: flow).
struct FlowConfig {
  FlowPath path = FlowPath::linear;
  FlowPrediction prediction = FlowPrediction::velocity;
  TimeSampling t_sampling = TimeSampling::uniform;
  std::vector<double> t_lognormal{0.0, 1.0};  ///< [m, s] of t_sampling: lognormal
  FlowLoss loss = FlowLoss::mse;

  template <class V>
  void visit(V& v) {
    v.field("path", path, "objective: flow interpolant: linear (SiT's default) or gvp");
    v.field("prediction", prediction, "objective: flow network output: velocity (SiT's default), noise or score");
    v.field("t_sampling", t_sampling,
            "objective: flow training times: uniform, or lognormal = sigmoid(N(m, s^2)) (LightningDiT)");
    v.field("t_lognormal", t_lognormal, "[m, s] of t_sampling: lognormal (LightningDiT: [0, 1])",
            config::Range{-100, 100});
    v.field("loss", loss,
            "objective: flow loss: mse, or mse+cosine (adds LightningDiT's 1 - cos(v, u) over channels; velocity)");
  }
  /// Rules of the flow keys of diffusion:.
  void validate(const config::RuleError& bad) const;
};

/// `diffusion:` — the Gaussian diffusion process of a DiT experiment (DiT: linear β, T = 1000, learned σ, hybrid loss).
struct DiffusionConfig {
  Objective objective{};  ///< ddpm
  int64_t steps = 1000;   ///< T of the training chain
  VaeKind vae = VaeKind::none;
  std::string vae_weights;  ///< AutoencoderKL file (diffusers or LDM names)

  template <class V>
  void visit(V& v) {
    v.field("objective", objective,
            "ddpm (DiT: eps prediction on a chain of T steps, learned sigma) or flow (SiT: flow matching on the "
            "interpolant of diffusion.path)");
    v.field("steps", steps, "ddpm: diffusion steps T of the training chain (linear beta schedule scaled by 1000/T)",
            config::Range{2, 1e6});
    v.field("vae", vae,
            "latent space: none = pixel-space diffusion, sd = SD kl-f8 latents (scale 0.18215), vavae = VA-VAE "
            "f16d32 latents (LightningDiT; standardised per channel with the extracted latents' statistics)");
    v.field("vae_weights", vae_weights,
            "the VAE's weights: vae: sd sd-vae-ft-ema/diffusion_pytorch_model.safetensors (or .bin); vae: vavae "
            "VA-VAE's vavae-imagenet256-f16d32-dinov2.pt (LDM names); an AutoencoderKL of the kind's layout at "
            "other widths loads too (read from the file)");
    flow.visit(v);
  }
  /// Rules of diffusion: alone (its objective's against the model: the objective record).
  void validate(const config::RuleError& bad) const;
  FlowConfig flow;
};

/// Widest REPA projector taken (REPA's is 2048): a wider one is a typo, and its weights would not fit a machine.
constexpr int64_t kMaxProjectorDim = 65536;

/// `train.repa:` — REPA's representation alignment of a DiT experiment (diffusion/repa.h); off while `encoder` is
/// empty.
struct RepaConfig {
  std::string
      encoder;        ///< a DINOv2 weights file (timm / official) or a classifier checkpoint / run dir of this toolkit
  int64_t depth = 8;  ///< 1-based block whose tokens are projected (REPA: 8 of SiT-XL's 28)
  double weight = 0.5;  ///< λ of the projection loss
  int64_t projector_dim = 2048;
  int64_t stage = 0;  ///< classifier encoder: which stage's tokens (1..4; 0 = the last)

  template <class V>
  void visit(V& v) {
    v.field("encoder", encoder,
            "frozen encoder of the clean images: a DINOv2 weights file (timm or official .safetensors/.pth; REPA: "
            "DINOv2 ViT-B/14) or a classifier checkpoint / run directory of this toolkit; empty = no REPA");
    v.field("depth", depth, "block whose output tokens are aligned (1-based; REPA: 8 for SiT-XL/2)",
            config::Range{1, 10000});
    v.field("weight", weight, "lambda of the alignment loss (REPA: 0.5)", config::Range{0, 1e6});
    v.field("projector_dim", projector_dim, "hidden width of the 3-layer projector MLP (REPA: 2048)",
            config::Range{1, kMaxProjectorDim});
    v.field("stage", stage,
            "classifier encoder: the stage whose tokens are the targets (1..4; 0 = the last), resized to the DiT's "
            "token grid",
            config::Range{0, 4});
  }
  /// Rules of train.repa: alone.
  void validate(const config::RuleError& bad) const;
};

/// A sampler's own settings: read from `sampling:` and handed as they are to the sampler (SampleOptions) and the flow
/// chains (FlowChainArgs), so a new setting is one field here and its schema line in SamplingConfig::visit.
struct SolverSettings {
  double eta = 0.0;                 ///< DDIM noise
  double atol = 1e-6, rtol = 1e-3;  ///< dopri5's tolerances (SiT's sample.py defaults)
  double timestep_shift = 0.0;      ///< flow euler / heun: warp of the time grid (LightningDiT; 0 = off)
};

/// `sampling:` — how `moh sample` (and the end-of-training samples) run the reverse process.
struct SamplingConfig {
  SamplerKind sampler = SamplerKind::ddpm;
  std::string steps = "250";  ///< respacing spec: "250", "ddim50", "10,15,20"; ODE solvers: a step count
  SolverSettings solver;      ///< eta, atol, rtol, timestep_shift
  double cfg_scale = 1.5;     ///< 1 = no guidance (no batch doubling)
  CfgChannels cfg_channels = CfgChannels::three;
  std::vector<double> cfg_interval{0.0, 1.0};  ///< guide where lo ≤ t / (T − 1) ≤ hi (1 = pure noise)
  bool clip_denoised = false;  ///< clamp predicted x0 to [−1, 1] each step (pixel models; DiT's latents: never)
  int64_t per_class = 10;
  int64_t batch_size = 64;
  int64_t seed = 0;
  int64_t topk = -1;                   ///< MoH head budget while sampling: K of every routed layer (−1 = as trained)
  std::vector<int64_t> topk_schedule;  ///< K per noise-level bucket, clean → pure noise (empty = topk everywhere)
  int64_t guide_topk = -1;             ///< K of the unconditional CFG branch (−1 = the conditional branch's K)
  CudaGraphMode cuda_graph = CudaGraphMode::automatic;
  Precision precision = Precision::tf32;  ///< the official sample.py's allow_tf32; fp32 on a CPU

  template <class V>
  void visit(V& v) {
    v.field("sampler", sampler,
            "ddpm (ancestral, what DiT uses), ddim, or an ODE solver: dpm++2m (DPM-Solver++ 2M), euler, heun "
            "(diffusers' schedulers on the same linear schedule); flow models (diffusion.objective: flow): euler, "
            "heun, dopri5 (adaptive, torchdiffeq's) or sde (Euler-Maruyama, SiT's SDE)");
    v.field("steps", steps,
            "ddpm/ddim: timestep respacing \"250\", \"ddim50\" or per-section counts \"10,15,20\"; ODE solvers: "
            "solver steps (>= 2; heun evaluates the network 2 x steps - 1 times); sde: steps including the last "
            "(SiT: 250); dopri5: not used (adaptive)");
    v.field("eta", solver.eta, "DDIM noise (0 = deterministic)", config::Range{0, 1000});
    v.field("atol", solver.atol, "dopri5 absolute tolerance (SiT: 1e-6)", config::Range{0, 1});
    v.field("rtol", solver.rtol, "dopri5 relative tolerance (SiT: 1e-3)", config::Range{0, 1});
    v.field("timestep_shift", solver.timestep_shift,
            "flow euler/heun: the time grid t -> s t / (1 + (s - 1) t) (LightningDiT's timestep_shift s: 0.3 puts "
            "more steps near noise; diffusers' flow-match shift 1/s on sigma = 1 - t); 0 = the plain grid",
            config::Range{0, 1000});
    v.field("cfg_scale", cfg_scale, "classifier-free guidance scale; 1 = off", config::Range{1, 1000});
    v.field("cfg_channels", cfg_channels,
            "guide the first 3 output channels (three, DiT-exact) or all eps channels (all)");
    v.field("cfg_interval", cfg_interval,
            "guidance interval [lo, hi] in noise level t / (T - 1) (1 = pure noise): CFG only inside, one "
            "conditional forward outside (Kynkaanniemi et al. 2024); [0, 1] = everywhere",
            config::Range{0, 1});
    v.field("clip_denoised", clip_denoised,
            "clamp the predicted x0 to [-1, 1] at every step (pixel space; DiT: false)");
    v.field("per_class", per_class, "images per class written by moh sample", config::Range{1, 1e7});
    v.field("batch_size", batch_size, "images per sampling batch (before CFG doubling)", config::Range{1, 1e6});
    v.field("seed", seed, "sampling seed", config::Range{0, 4294967295});
    v.field("topk", topk,
            "MoH head budget at inference: routed heads per token K of every routed layer, 0 … the smallest routed "
            "pool (no retraining; 0 = the shared heads alone; -1 = as trained)",
            config::Range{-1, 4096});
    v.field("topk_schedule", topk_schedule,
            "MoH head budget by noise level: B values of K for B equal buckets of t / (T - 1), from clean (first) "
            "to pure noise (last), e.g. [2, 2, 4, 4]; empty = sampling.topk at every step",
            config::Range{-1, 4096});
    v.field("guide_topk", guide_topk,
            "guide with fewer heads: K of the unconditional branch of CFG (the two branches then run as two "
            "forwards); -1 = the same K as the conditional branch",
            config::Range{-1, 4096});
    v.field("cuda_graph", cuda_graph,
            "replay the network evaluations as CUDA graphs (auto: on a GPU where the forward can be captured; "
            "off: eager); the samples are the same either way");
    v.field("precision", precision,
            "network precision while sampling: tf32 (fp32 with TF32 matrix products on CUDA, as DiT's sample.py "
            "sets allow_tf32; fp32 on a CPU), fp32, bf16 (autocast, CPU or CUDA) or fp16 (CUDA); the sampler's "
            "own arithmetic stays fp32 and the VAE decoder runs without autocast");
  }
  /// Rules of sampling: alone (against the model and objective: validate_dit_experiment).
  void validate(const config::RuleError& bad) const;
};

}  // namespace moh
