#pragma once
// The training sections of an experiment file (`optim:`, `schedule:`, `train:`) and their choices: what the one
// training loop (core/train/train_loop.h) reads. The whole file is experiments/experiment_config.h; each section is
// declared by the library that owns its words, all registered with the schema through the same visit().
#include <cstdint>
#include <string>
#include <vector>

#include "core/config_schema.h"

namespace moh {

/// Numeric precision of forward + loss (master weights, optimizer and EMA stay fp32). `automatic` ("auto") is
/// resolved by RunContext::create: bf16 on CUDA; on a CPU bf16 where this build's bf16 autocast is measured clearly
/// faster than fp32 on this CPU (core/platform/cpu_precision.h, cached per machine), else fp32. `tf32` is fp32 with
/// CUDA's matrix products and convolutions allowed to round their inputs to TF32 (the official DiT's train.py and
/// sample.py setting; core/platform/amp.h Tf32Scope); a CPU computes it as fp32.
enum class Precision { fp32, bf16, fp16, automatic, tf32 };
const config::EnumTable<Precision>& enum_table(Precision);

/// How AdamW's step, the gradient clipping and the EMA update run over the parameters (core/train/optimizer.h):
/// `for_loop` one kernel per op per tensor (LibTorch's torch::optim::AdamW, the reference), `foreach` multi-tensor
/// kernels, `fused` one pass per parameter (_fused_adamw_), `automatic` ("auto") fused on CUDA where the build has it,
/// else foreach.
enum class OptimImpl { for_loop, foreach, fused, automatic };
const config::EnumTable<OptimImpl>& enum_table(OptimImpl);

/// Activation checkpointing of a training run: `none`, or `blocks` (every transformer block's activations are
/// recomputed in the backward pass instead of kept: larger batches per device for about a third more compute).
enum class GradCheckpoint { none, blocks };
const config::EnumTable<GradCheckpoint>& enum_table(GradCheckpoint);

/// Learning-rate schedule shape.
enum class LrSchedule { cosine, constant };
const config::EnumTable<LrSchedule>& enum_table(LrSchedule);

/// Whether the schedule advances once per epoch (official DeiT/TransNeXt recipe) or every optimizer step.
enum class ScheduleUnit { epoch, step };
const config::EnumTable<ScheduleUnit>& enum_table(ScheduleUnit);

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
    v.field("lr", lr, "peak learning rate (absolute, no batch scaling)", config::Range{0, 10});
    v.field("weight_decay", weight_decay, "AdamW decoupled weight decay", config::Range{0, 100});
    v.field("betas", betas, "AdamW (beta1, beta2)", config::Range{0, 1});
    v.field("eps", eps, "AdamW epsilon", config::Range{0, 1});
    v.field("clip_grad", clip_grad, "clip the global gradient norm to this value; 0 = off", config::Range{0, 1e6});
    v.field("impl", impl,
            "how AdamW, clipping and EMA run over the parameters: for_loop (per tensor, the reference), foreach "
            "(multi-tensor kernels), fused (one pass per parameter; LibTorch >= 2.0 CUDA, >= 2.4 CPU) or auto "
            "(fused on CUDA where available, else foreach)");
  }
  /// Rules of optim: alone (AdamW's ranges).
  void validate(const config::RuleError& bad) const;
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
    v.field("warmup_epochs", warmup_epochs, "linear warm-up length in epochs", config::Range{0, 1e6});
    v.field("warmup_lr", warmup_lr, "learning rate at the start of warm-up", config::Range{0, 10});
    v.field("min_lr", min_lr, "final learning rate of the cosine", config::Range{0, 10});
  }
  /// Rules of schedule: alone (min_lr against optim.lr: ExperimentConfig).
  void validate(const config::RuleError& bad) const;
};

/// `train.phema:` — post-hoc EMA (EDM2): power-function EMA profiles tracked during training and written as
/// snapshots, from which `moh ema reconstruct` makes an EMA of any length after training (core/train/phema.h).
struct PhemaConfig {
  std::vector<double> sigma_rels;  ///< σ_rel of each tracked profile; empty = off
  int64_t snapshot_every = 0;      ///< optimizer steps between snapshots in RUN/phema/

  template <class V>
  void visit(V& v) {
    v.field("sigma_rels", sigma_rels,
            "relative std of each tracked power-function EMA profile (EDM2: [0.05, 0.10]); empty = off",
            config::Range{0, 1});  // the profiles' own range (phema::check_config) is narrower
    v.field("snapshot_every", snapshot_every,
            "write every tracked profile to RUN/phema/STEP/ every N optimizer steps (EDM2: 8 Mimg / batch); "
            "moh ema reconstruct combines them into an EMA of any sigma_rel",
            config::Range{0, 1e12});
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
  bool paired = false;  ///< common random numbers across model variants (initial weights by name, noise after build)
  Precision precision = Precision::fp32;
  std::string device = "auto";
  double ema_decay = 0.0;   ///< 0 = no EMA
  bool ema_warmup = false;  ///< decay_t = min(decay, (1 + t) / (10 + t)) instead of a constant decay
  int64_t ckpt_every_epochs = 1;
  int64_t ckpt_every_steps = 0;  ///< also a checkpoint every N optimizer steps inside epochs (0 = epoch ends only)
  int64_t log_every_steps = 50;
  double label_smoothing = 0.1;
  int64_t eval_every_epochs = 1;
  int64_t max_steps = 0;       ///< stop after this many optimizer steps (0 = run all epochs)
  bool deterministic = false;  ///< deterministic kernels (CUDA: bit-identical reruns and resumes)
  GradCheckpoint grad_checkpoint = GradCheckpoint::none;
  int64_t max_nonfinite_steps = 10;  ///< non-finite steps in a row that end the run (0 = skip them, never stop)
  int64_t keep_last = 0;             ///< checkpoints kept besides best and milestones (0 = all)
  int64_t keep_every_steps = 0;      ///< checkpoints at multiples of this step kept forever (0 = none)
  PhemaConfig phema;                 ///< train.phema

  template <class V>
  void visit(V& v) {
    v.field("epochs", epochs, "number of training epochs", config::Range{1, 1e6});
    v.field("accum_steps", accum_steps, "gradient accumulation steps per optimizer step", config::Range{1, 65536});
    v.field("processes", processes,
            "data-parallel processes moh train starts on this machine (as moh launch --nproc N) "
            "unless already launched; on CPUs small models train faster as N 1-thread processes",
            config::Range{1, 512});
    v.field("moh_loss_coeff", moh_loss_coeff, "beta: weight of the MoH load-balance loss (mean over routed layers)",
            config::Range{0, 1e6});
    v.field("seed", seed, "global random seed", config::Range{0, 4294967295});
    v.field("paired", paired,
            "common random numbers across model variants of one seed: every module's initial weights drawn from a "
            "generator seeded by (seed, its name), so parameters two variants share start equal, and the training "
            "noise reseeded once the model is built (data order depends on the seed alone either way)");
    v.field("precision", precision,
            "forward precision: fp32, tf32 (fp32 with TF32 matrix products on CUDA, as the official DiT's train.py; "
            "fp32 on a CPU), bf16 (autocast on CPU or CUDA), fp16 (CUDA, loss scaling) or auto (bf16 on CUDA; on a "
            "CPU bf16 where measured faster than fp32 on this CPU and build, else fp32)");
    v.field("device", device, "auto, cpu, cuda or cuda:N");
    v.field("ema_decay", ema_decay, "EMA decay of the weights; 0 = no EMA", config::Range{0, 1});
    v.field("ema_warmup", ema_warmup,
            "EMA decay min(ema_decay, (1+step)/(10+step)) for short runs; off = constant (DiT)");
    v.field("ckpt_every_epochs", ckpt_every_epochs, "write a checkpoint every N epochs", config::Range{1, 1e6});
    v.field("ckpt_every_steps", ckpt_every_steps,
            "also write a checkpoint every N optimizer steps inside epochs (DiT's --ckpt-every; a resume continues "
            "inside the epoch); 0 = at epoch ends only",
            config::Range{0, 1e12});
    v.field("log_every_steps", log_every_steps, "write a metrics line every N optimizer steps", config::Range{1, 1e12});
    v.field("label_smoothing", label_smoothing, "label smoothing of the classification loss", config::Range{0, 1});
    v.field("eval_every_epochs", eval_every_epochs, "evaluate every N epochs (and after the last)",
            config::Range{1, 1e6});
    v.field("max_steps", max_steps, "stop after N optimizer steps (0 = run all epochs; for smoke tests)",
            config::Range{0, 1e12});
    v.field("deterministic", deterministic,
            "deterministic kernels only (torch.use_deterministic_algorithms; CUBLAS_WORKSPACE_CONFIG=:4096:8): "
            "on a GPU, reruns and resumed runs equal uninterrupted ones bit for bit, at some speed; CPU runs are "
            "deterministic without it");
    v.field("max_nonfinite_steps", max_nonfinite_steps,
            "steps with a non-finite loss or gradient (skipped, as an fp16 overflow) in a row that end the run with "
            "exit 1, naming the last finite checkpoint; 0 = keep skipping",
            config::Range{0, 1e9});
    v.field("keep_last", keep_last,
            "keep only the newest N checkpoints (besides the best one and the milestones); 0 = keep every one",
            config::Range{0, 1e9});
    v.field("keep_every_steps", keep_every_steps,
            "keep the checkpoints whose step is a multiple of N forever (milestones); 0 = none",
            config::Range{0, 1e12});
    v.field("grad_checkpoint", grad_checkpoint,
            "activation checkpointing: none, or blocks (each block's activations recomputed in the backward pass: "
            "less memory, larger batches, about 1/3 more compute; gradients unchanged)");
    v.section("phema", phema, "post-hoc EMA (EDM2): tracked power-function profiles and their snapshots");
  }
  /// Rules of train: alone (train.phema: phema::check_config; train.repa: its section).
  void validate(const config::RuleError& bad) const;
};

/// `log:` — what a run writes besides metrics.jsonl and log.txt.
struct LogConfig {
  bool tensorboard = false;
  template <class V>
  void visit(V& v) {
    v.field(
        "tensorboard", tensorboard,
        "also write TensorBoard event files to RUN/tb: every metrics.jsonl number at its step, the head-load shares "
        "as heat maps, the resolved config as text; moh sample of its checkpoints adds the sample grid");
  }
};

/// Weights a fresh run starts from (`model.weights`; a resumed run takes its checkpoint's instead).
struct InitialWeights {
  std::string path;            ///< "" = the task's own initialisation
  std::string key;             ///< the entry of a nested checkpoint to load (ema, model, state_dict; "" = whole)
  bool allow_missing = false;  ///< parameters the file lacks keep their initialisation
};

/// What the training loop reads of an experiment: the sections above, the global batch, the starting weights and
/// the whole resolved experiment file (stored in every checkpoint, compared on resume, agreed on by every rank).
/// The experiments layer fills it from the whole file; the loop knows no other section.
struct LoopConfig {
  std::string name;        ///< the run's name (runs/<name> by default)
  std::string yaml;        ///< the resolved experiment file
  int64_t batch_size = 0;  ///< global batch per optimizer step (all ranks, all accumulation steps)
  OptimConfig optim;
  ScheduleConfig schedule;
  TrainConfig train;
  LogConfig log;
  InitialWeights weights;
  /// Keys of `yaml` a resumed run may not change (the checkpoint's weights would not fit it) and keys it changes only
  /// with --allow-config-change (the data stream and the batch), named by the sections and the family that own them;
  /// the loop adds its own train.* keys (config_keys_guarded_on_resume).
  std::vector<std::string> fixed_on_resume, guarded_on_resume;
};

}  // namespace moh
