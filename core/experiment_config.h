#pragma once
// The typed, versioned experiment configuration: the only place YAML becomes values. Models and trainers take the
// structs below (or options derived from them), never YAML. Keys, types, defaults and meanings are declared once in
// each struct's visit(); `moh config --schema` prints them.
#include <cstdint>
#include <string>
#include <vector>

#include "core/config_schema.h"

namespace moh {

/// Largest model.img_size accepted (a sanity bound; memory is checked against the machine separately).
constexpr int64_t kMaxImageSize = 8192;

/// Current config format version (`version:` in every experiment file).
constexpr int64_t kConfigVersion = 1;

/// How heads are mixed in an attention layer.
enum class AttentionMode { mha, moh, moa };
const config::EnumTable<AttentionMode>& enum_table(AttentionMode);

/// Execution path of MoH attention: `dense` computes every head then gates (the official code, the reference);
/// `sparse` computes only the selected (token, head) pairs; `automatic` ("auto", the default) lets each layer pick
/// the faster of the two from its active-head ratio and sequence length (vision/nn/attention_core.h:
/// choose_attention_path).
enum class AttentionPath { dense, sparse, automatic };
const config::EnumTable<AttentionPath>& enum_table(AttentionPath);

/// How a MoH layer chooses its routed heads: `learned` (the official router `wg`/`wg_0`/`wg_1`, Eq. 5 of the paper)
/// or `query_norm` (no parameters, as the released continue-tuned MoH-LLaMA3: per token the L2 norms of the routed
/// heads' query projections, divided by their standard deviation, softmax, top-K; selected heads and shared heads
/// get weight 1, the others 0, so a dense model's output distribution is kept).
enum class RouterKind { learned, query_norm };
const config::EnumTable<RouterKind>& enum_table(RouterKind);

/// Numeric precision of forward + loss (master weights, optimizer and EMA stay fp32). `automatic` ("auto") is
/// resolved by RunContext::create: bf16 on CUDA; on a CPU bf16 where this build's bf16 autocast is measured clearly
/// faster than fp32 on this CPU (core/cpu_precision.h, cached per machine), else fp32.
enum class Precision { fp32, bf16, fp16, automatic };
const config::EnumTable<Precision>& enum_table(Precision);

/// How AdamW's step, the gradient clipping and the EMA update run over the parameters (core/optimizer.h):
/// `for_loop` one kernel per op per tensor (LibTorch's torch::optim::AdamW, the reference), `foreach` multi-tensor
/// kernels, `fused` one pass per parameter (_fused_adamw_), `automatic` ("auto") fused on CUDA where the build has it,
/// else foreach.
enum class OptimImpl { for_loop, foreach, fused, automatic };
const config::EnumTable<OptimImpl>& enum_table(OptimImpl);

/// Activation checkpointing of a training run: `none`, or `blocks` (every transformer block's activations are
/// recomputed in the backward pass instead of kept: larger batches per device for about a third more compute).
enum class GradCheckpoint { none, blocks };
const config::EnumTable<GradCheckpoint>& enum_table(GradCheckpoint);

/// Built-in dataset readers.
enum class DatasetKind { fashion_mnist, image_folder, latents };
const config::EnumTable<DatasetKind>& enum_table(DatasetKind);

/// How classification images reach the model: decoded once into memory (small sets) or streamed (ImageNet).
enum class LoaderKind { memory, stream };
const config::EnumTable<LoaderKind>& enum_table(LoaderKind);

/// Learning-rate schedule shape.
enum class LrSchedule { cosine, constant };
const config::EnumTable<LrSchedule>& enum_table(LrSchedule);

/// Whether the schedule advances once per epoch (official DeiT/TransNeXt recipe) or every optimizer step.
enum class ScheduleUnit { epoch, step };
const config::EnumTable<ScheduleUnit>& enum_table(ScheduleUnit);

/// Latent space of a diffusion model: `none` = pixel-space diffusion.
enum class VaeKind { none, sd };
const config::EnumTable<VaeKind>& enum_table(VaeKind);

/// Reverse-process sampler: DDPM / DDIM over a respaced chain, or a probability-flow ODE solver (DPM-Solver++(2M),
/// Euler, Heun) over the base chain.
enum class SamplerKind { ddpm, ddim, dpmpp_2m, euler, heun };
const config::EnumTable<SamplerKind>& enum_table(SamplerKind);

/// Output channels classifier-free guidance is applied to: `three` = the first 3 (DiT's code, needed for parity with
/// published FIDs), `all` = every ε channel (the standard formulation, diffusers).
enum class CfgChannels { three, all };
const config::EnumTable<CfgChannels>& enum_table(CfgChannels);

/// Whether sampling replays its network evaluations as CUDA graphs: `automatic` ("auto") on a GPU with a CUDA
/// LibTorch where the forward can be captured, else eager; `off` always eager.
enum class CudaGraphMode { automatic, off };
const config::EnumTable<CudaGraphMode>& enum_table(CudaGraphMode);

/// `model:` — which network and how its attention runs.
struct ModelConfig {
  std::string name;                      ///< registry name, e.g. "MoH-ViT-S-75" (`moh info --list`)
  std::vector<AttentionMode> attention;  ///< per-stage override of the head mixing; empty = variant default
  AttentionPath attention_path = AttentionPath::automatic;
  RouterKind router = RouterKind::learned;  ///< how MoH layers choose their routed heads
  std::vector<int64_t> shared_heads;        ///< MoH split override: h_s per stage (classifier) or layer (DiT)
  std::vector<int64_t> topk;                ///< with shared_heads: K per stage / layer (0 = all heads weighted)
  int64_t num_classes = 0;                  ///< 0 = variant default
  int64_t img_size = 0;                     ///< 0 = variant default
  double drop_path = -1.0;                  ///< < 0 = variant default
  std::string weights;                      ///< initialise from this file (safetensors or torch.save)
  std::string weights_key;                  ///< key inside a nested checkpoint (ema|model|state_dict)
  bool weights_allow_missing = false;       ///< tolerate tensors the weights file lacks (e.g. pos_embed)

  template <class V>
  void visit(V& v) {
    v.field("name", name, "model variant from the registry (`moh info --list`)", config::Need::required);
    v.field("attention", attention, "per-stage head mixing override (mha|moh|moa); empty = the variant's own");
    v.field("attention_path", attention_path,
            "MoH execution path of the attention layers (DiT and classifier): auto (per layer, the faster path for its "
            "active ratio and length), dense (official, gates all heads) or sparse (selected pairs only)");
    v.field("router", router,
            "MoH head router: learned (official, wg / wg_0 / wg_1) or query_norm (parameter-free: top-K of the routed "
            "heads' query norms, selected and shared heads weighted 1; for dense checkpoints turned into MoH)");
    v.field("shared_heads", shared_heads,
            "MoH split on the variant's own heads (a dense model becomes MoH: `moh convert --to-moh`): shared heads "
            "h_s per stage (classifiers, 4 values) or per layer (DiT: depth values, or one for every layer)");
    v.field("topk", topk,
            "with model.shared_heads: routed heads per token K of each stage / layer (same length; 0 = every head "
            "on, softmax-weighted, needs shared = heads)");
    v.field("num_classes", num_classes, "classifier outputs / DiT label classes; 0 = variant default");
    v.field("img_size", img_size, "input resolution in pixels; 0 = variant default");
    v.field("drop_path", drop_path, "stochastic-depth rate at the last block; negative = variant default");
    v.field("weights", weights, "initialise from this weights file (.safetensors or torch.save .pt/.pth)");
    v.field("weights_key", weights_key, "entry inside a nested checkpoint to load (ema, model, state_dict)");
    v.field("weights_allow_missing", weights_allow_missing,
            "keep initialised values for tensors the weights file lacks");
  }
};

/// `data:` — where images come from and how many per step.
struct DataConfig {
  DatasetKind dataset = DatasetKind::fashion_mnist;
  LoaderKind loader = LoaderKind::memory;
  std::string root;          ///< "" = dataset default (/usr/share/datasets/fashion-mnist)
  int64_t batch_size = 128;  ///< global batch (summed over ranks and accumulation steps)
  int64_t num_workers = 2;
  double max_bad_fraction = 0.01;
  int64_t limit_train = 0;  ///< use a seeded random subset of N training images (0 = all)
  int64_t limit_val = 0;
  int64_t eval_batch_size = 256;
  int64_t shift = 0;   ///< small-image augmentation: random translation of up to ±shift pixels
  bool hflip = false;  ///< small-image augmentation: random horizontal flip

  template <class V>
  void visit(V& v) {
    v.field("dataset", dataset,
            "reader: fashion_mnist (IDX gz), image_folder (<root>/{train,val}/<class>/*) or latents "
            "(shards of moh extract-latents in <root>, DiT training)");
    v.field("loader", loader,
            "classification input: memory (decode the split once; small sets, data.shift/hflip "
            "augmentation) or stream (image_folder decoded per batch with the augment: section)");
    v.field("root", root, "dataset directory; empty = the reader's default");
    v.field("batch_size", batch_size, "global batch size per optimizer step");
    v.field("num_workers", num_workers, "decoding/augmentation threads");
    v.field("max_bad_fraction", max_bad_fraction, "fraction of unreadable images tolerated before it is an error");
    v.field("limit_train", limit_train, "use a seeded random subset of N training images (0 = all)");
    v.field("limit_val", limit_val, "use a seeded random subset of N validation images (0 = all)");
    v.field("eval_batch_size", eval_batch_size, "batch size for evaluation");
    v.field("shift", shift, "training augmentation for small images: random translation of up to ±N pixels");
    v.field("hflip", hflip, "training augmentation for small images: random horizontal flip (p = 0.5)");
  }
};

/// `augment:` — classification augmentation of the ImageNet recipe (timm create_transform + Mixup). The crop, flip,
/// RandAugment, repeated augmentation and eval crop apply to `data.loader: stream`; random erasing and
/// Mixup/CutMix apply to either loader.
struct AugmentConfig {
  bool random_resized_crop = true;
  std::vector<double> scale{0.08, 1.0};
  std::vector<double> ratio{0.75, 4.0 / 3.0};
  double hflip = 0.5;
  std::string rand_augment;  ///< timm spec, e.g. "rand-m9-mstd0.5-inc1"; "" = off
  double erase_prob = 0.0;
  double mixup = 0.0, cutmix = 0.0;
  double mixup_prob = 1.0, mixup_switch_prob = 0.5;
  int64_t repeated = 1;
  double eval_crop_pct = 0.875;

  template <class V>
  void visit(V& v) {
    v.field("random_resized_crop", random_resized_crop,
            "stream: RandomResizedCrop to the model size (bicubic); off = resize");
    v.field("scale", scale, "stream: RandomResizedCrop area range [min, max]");
    v.field("ratio", ratio, "stream: RandomResizedCrop aspect-ratio range [min, max]");
    v.field("hflip", hflip, "stream: horizontal-flip probability");
    v.field("rand_augment", rand_augment, "stream: timm RandAugment spec (rand-m9-mstd0.5-inc1); empty = off");
    v.field("erase_prob", erase_prob, "random erasing probability (mode pixel, one box)");
    v.field("mixup", mixup, "Mixup alpha (0 = off)");
    v.field("cutmix", cutmix, "CutMix alpha (0 = off)");
    v.field("mixup_prob", mixup_prob, "probability of mixing a batch");
    v.field("mixup_switch_prob", mixup_switch_prob, "probability of CutMix instead of Mixup when both are on");
    v.field("repeated", repeated, "stream: repeated augmentation count (DeiT RASampler); 1 = off");
    v.field("eval_crop_pct", eval_crop_pct,
            "stream: evaluation resizes the short side to size / crop_pct, then centre-crops");
  }
};

/// `optim:` — AdamW settings.
struct OptimConfig {
  double lr = 1e-3;
  double weight_decay = 0.05;
  std::vector<double> betas{0.9, 0.999};
  double eps = 1e-8;
  double clip_grad = 1.0;  ///< global grad-norm clip; 0 = off
  OptimImpl impl = OptimImpl::automatic;

  template <class V>
  void visit(V& v) {
    v.field("lr", lr, "peak learning rate (absolute, no batch scaling)");
    v.field("weight_decay", weight_decay, "AdamW decoupled weight decay");
    v.field("betas", betas, "AdamW (beta1, beta2)");
    v.field("eps", eps, "AdamW epsilon");
    v.field("clip_grad", clip_grad, "clip the global gradient norm to this value; 0 = off");
    v.field("impl", impl,
            "how AdamW, clipping and EMA run over the parameters: for_loop (per tensor, the reference), foreach "
            "(multi-tensor kernels), fused (one pass per parameter; LibTorch >= 2.0 CUDA, >= 2.4 CPU) or auto "
            "(fused on CUDA where available, else foreach)");
  }
};

/// `schedule:` — learning-rate schedule.
struct ScheduleConfig {
  LrSchedule kind = LrSchedule::cosine;
  ScheduleUnit unit = ScheduleUnit::epoch;
  double warmup_epochs = 5;
  double warmup_lr = 1e-6;
  double min_lr = 1e-5;

  template <class V>
  void visit(V& v) {
    v.field("kind", kind, "cosine (with linear warm-up) or constant");
    v.field("unit", unit, "advance the schedule per epoch (official recipe) or per step");
    v.field("warmup_epochs", warmup_epochs, "linear warm-up length in epochs");
    v.field("warmup_lr", warmup_lr, "learning rate at the start of warm-up");
    v.field("min_lr", min_lr, "final learning rate of the cosine");
  }
};

/// `train:` — the loop.
struct TrainConfig {
  int64_t epochs = 300;
  int64_t accum_steps = 1;
  int64_t processes =
      1;  ///< data-parallel processes `moh train` starts itself when not launched by torchrun/moh launch
  double moh_loss_coeff = 0.01;  ///< beta of the MoH load-balance loss (paper Eq. 8)
  int64_t seed = 0;
  Precision precision = Precision::fp32;
  std::string device = "auto";
  double ema_decay = 0.0;   ///< 0 = no EMA
  bool ema_warmup = false;  ///< decay_t = min(decay, (1 + t) / (10 + t)) instead of a constant decay
  int64_t ckpt_every_epochs = 1;
  int64_t log_every_steps = 50;
  double label_smoothing = 0.1;
  int64_t eval_every_epochs = 1;
  int64_t max_steps = 0;       ///< stop after this many optimizer steps (0 = run all epochs)
  bool deterministic = false;  ///< deterministic kernels (CUDA: bit-identical reruns and resumes)
  GradCheckpoint grad_checkpoint = GradCheckpoint::none;
  int64_t max_nonfinite_steps = 10;  ///< non-finite steps in a row that end the run (0 = skip them, never stop)
  int64_t keep_last = 0;             ///< checkpoints kept besides best and milestones (0 = all)
  int64_t keep_every_steps = 0;      ///< checkpoints at multiples of this step kept forever (0 = none)

  template <class V>
  void visit(V& v) {
    v.field("epochs", epochs, "number of training epochs");
    v.field("accum_steps", accum_steps, "gradient accumulation steps per optimizer step");
    v.field("processes", processes,
            "data-parallel processes moh train starts on this machine (as moh launch --nproc N) "
            "unless already launched; on CPUs small models train faster as N 1-thread processes");
    v.field("moh_loss_coeff", moh_loss_coeff, "beta: weight of the MoH load-balance loss (mean over routed layers)");
    v.field("seed", seed, "global random seed");
    v.field("precision", precision,
            "forward precision: fp32, bf16 (autocast on CPU or CUDA), fp16 (CUDA, loss scaling) "
            "or auto (bf16 on CUDA; on a CPU bf16 where measured faster than fp32 on this CPU and build, else fp32)");
    v.field("device", device, "auto, cpu, cuda or cuda:N");
    v.field("ema_decay", ema_decay, "EMA decay of the weights; 0 = no EMA");
    v.field("ema_warmup", ema_warmup,
            "EMA decay min(ema_decay, (1+step)/(10+step)) for short runs; off = constant (DiT)");
    v.field("ckpt_every_epochs", ckpt_every_epochs, "write a checkpoint every N epochs");
    v.field("log_every_steps", log_every_steps, "write a metrics line every N optimizer steps");
    v.field("label_smoothing", label_smoothing, "label smoothing of the classification loss");
    v.field("eval_every_epochs", eval_every_epochs, "evaluate every N epochs (and after the last)");
    v.field("max_steps", max_steps, "stop after N optimizer steps (0 = run all epochs; for smoke tests)");
    v.field("deterministic", deterministic,
            "deterministic kernels only (torch.use_deterministic_algorithms; CUBLAS_WORKSPACE_CONFIG=:4096:8): "
            "on a GPU, reruns and resumed runs equal uninterrupted ones bit for bit, at some speed; CPU runs are "
            "deterministic without it");
    v.field("max_nonfinite_steps", max_nonfinite_steps,
            "steps with a non-finite loss or gradient (skipped, as an fp16 overflow) in a row that end the run with "
            "exit 1, naming the last finite checkpoint; 0 = keep skipping");
    v.field("keep_last", keep_last,
            "keep only the newest N checkpoints (besides the best one and the milestones); 0 = keep every one");
    v.field("keep_every_steps", keep_every_steps,
            "keep the checkpoints whose step is a multiple of N forever (milestones); 0 = none");
    v.field("grad_checkpoint", grad_checkpoint,
            "activation checkpointing: none, or blocks (each block's activations recomputed in the backward pass: "
            "less memory, larger batches, about 1/3 more compute; gradients unchanged)");
  }
};

/// `diffusion:` — the Gaussian diffusion process of a DiT experiment (DiT: linear β, T = 1000, learned σ, hybrid loss).
struct DiffusionConfig {
  int64_t steps = 1000;  ///< T of the training chain
  VaeKind vae = VaeKind::none;
  std::string vae_weights;  ///< diffusers AutoencoderKL file (vae: sd)

  template <class V>
  void visit(V& v) {
    v.field("steps", steps, "diffusion steps T of the training chain (linear beta schedule scaled by 1000/T)");
    v.field("vae", vae, "latent space: none = pixel-space diffusion, sd = SD kl-f8 latents (scale 0.18215)");
    v.field("vae_weights", vae_weights,
            "vae: sd weights, e.g. sd-vae-ft-ema/diffusion_pytorch_model.safetensors (or .bin)");
  }
};

/// `sampling:` — how `moh sample` (and the end-of-training samples) run the reverse process.
struct SamplingConfig {
  SamplerKind sampler = SamplerKind::ddpm;
  std::string steps = "250";  ///< respacing spec: "250", "ddim50", "10,15,20"; ODE solvers: a step count
  double eta = 0.0;
  double cfg_scale = 1.5;  ///< 1 = no guidance (no batch doubling)
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

  template <class V>
  void visit(V& v) {
    v.field("sampler", sampler,
            "ddpm (ancestral, what DiT uses), ddim, or an ODE solver: dpm++2m (DPM-Solver++ 2M), euler, heun "
            "(diffusers' schedulers on the same linear schedule)");
    v.field("steps", steps,
            "ddpm/ddim: timestep respacing \"250\", \"ddim50\" or per-section counts \"10,15,20\"; ODE solvers: "
            "solver steps (>= 2; heun evaluates the network 2 x steps - 1 times)");
    v.field("eta", eta, "DDIM noise (0 = deterministic)");
    v.field("cfg_scale", cfg_scale, "classifier-free guidance scale; 1 = off");
    v.field("cfg_channels", cfg_channels,
            "guide the first 3 output channels (three, DiT-exact) or all eps channels (all)");
    v.field("cfg_interval", cfg_interval,
            "guidance interval [lo, hi] in noise level t / (T - 1) (1 = pure noise): CFG only inside, one "
            "conditional forward outside (Kynkaanniemi et al. 2024); [0, 1] = everywhere");
    v.field("clip_denoised", clip_denoised,
            "clamp the predicted x0 to [-1, 1] at every step (pixel space; DiT: false)");
    v.field("per_class", per_class, "images per class written by moh sample");
    v.field("batch_size", batch_size, "images per sampling batch (before CFG doubling)");
    v.field("seed", seed, "sampling seed");
    v.field("topk", topk,
            "MoH head budget at inference: routed heads per token K of every routed layer, 0 … the smallest routed "
            "pool (no retraining; 0 = the shared heads alone; -1 = as trained)");
    v.field("topk_schedule", topk_schedule,
            "MoH head budget by noise level: B values of K for B equal buckets of t / (T - 1), from clean (first) "
            "to pure noise (last), e.g. [2, 2, 4, 4]; empty = sampling.topk at every step");
    v.field("guide_topk", guide_topk,
            "guide with fewer heads: K of the unconditional branch of CFG (the two branches then run as two "
            "forwards); -1 = the same K as the conditional branch");
    v.field("cuda_graph", cuda_graph,
            "replay the network evaluations as CUDA graphs (auto: on a GPU where the forward can be captured; "
            "off: eager); the samples are the same either way");
  }
};

/// The whole experiment file.
struct ExperimentConfig {
  int64_t version = kConfigVersion;
  std::string name;  ///< run name; "" = the config file's stem
  ModelConfig model;
  DataConfig data;
  AugmentConfig augment;
  OptimConfig optim;
  ScheduleConfig schedule;
  TrainConfig train;
  DiffusionConfig diffusion;
  SamplingConfig sampling;

  template <class V>
  void visit(V& v) {
    v.field("version", version, "config format version (this toolkit reads 1)");
    v.field("name", name, "run name; empty = the config file's stem");
    v.section("model", model, "network variant and attention options");
    v.section("data", data, "dataset, batch size and loading");
    v.section("augment", augment, "classification augmentation (ImageNet recipe)");
    v.section("optim", optim, "optimizer (AdamW)");
    v.section("schedule", schedule, "learning-rate schedule");
    v.section("train", train, "training loop");
    v.section("diffusion", diffusion, "Gaussian diffusion process (DiT experiments)");
    v.section("sampling", sampling, "reverse-process sampling and classifier-free guidance (DiT experiments)");
  }

  /// Cross-field rules; throws UserError naming the key (origin = the config file).
  void validate(const std::string& origin) const;
};

/// One layer's (or stage's) MoH split from model.shared_heads / model.topk.
struct HeadSplit {
  int64_t shared = 0, topk = 0;
};
/// The split model.shared_heads / model.topk gives to `heads.size()` layers (stages) with heads[i] heads each; one
/// value for all of them when `one_for_all` allows it. Empty when neither key is set; UserErrors naming the key for
/// a missing partner, a wrong length or a value outside 0 ≤ h_s ≤ h, 0 ≤ K ≤ h − h_s (K = 0 needs h_s = h).
std::vector<HeadSplit> moh_split(const ModelConfig& model, const std::vector<int64_t>& heads, bool one_for_all,
                                 const std::string& unit);

/// Loads a config file with `base:` inheritance and `--set` overrides, parses it strictly and validates it.
ExperimentConfig load_experiment(const std::string& path, const std::vector<std::string>& overrides = {});

/// Parses and validates resolved YAML text (e.g. the config.resolved.yaml stored in a checkpoint).
ExperimentConfig parse_experiment(const std::string& yaml_text, const std::string& origin);

/// A resolved config with `--set` overrides applied (through its YAML form, so the same strict parsing and
/// validation apply; origin names the overrides in errors).
ExperimentConfig with_overrides(const ExperimentConfig& cfg, const std::vector<std::string>& overrides,
                                const std::string& origin = "--set");

/// The resolved config as YAML text (printed at start, saved in run dirs and checkpoints).
std::string to_yaml(const ExperimentConfig& cfg);

/// One key whose value differs between two resolved configs (YAML text of each side; "(absent)" if missing).
struct ConfigChange {
  std::string key, before, after;
};
/// The keys (dotted, sorted) whose values differ between two resolved config texts (e.g. a checkpoint's and the
/// resumed run's); `name` is ignored.
std::vector<ConfigChange> config_changes(const std::string& before_yaml, const std::string& after_yaml);

}  // namespace moh
