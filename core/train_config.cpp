#include "core/train_config.h"

namespace moh {

const config::EnumTable<Precision>& enum_table(Precision) {
  static const config::EnumTable<Precision> t{{Precision::fp32, "fp32"},
                                              {Precision::tf32, "tf32"},
                                              {Precision::bf16, "bf16"},
                                              {Precision::fp16, "fp16"},
                                              {Precision::automatic, "auto"}};
  return t;
}

const config::EnumTable<OptimImpl>& enum_table(OptimImpl) {
  static const config::EnumTable<OptimImpl> t{{OptimImpl::for_loop, "for_loop"},
                                              {OptimImpl::foreach, "foreach"},
                                              {OptimImpl::fused, "fused"},
                                              {OptimImpl::automatic, "auto"}};
  return t;
}

const config::EnumTable<GradCheckpoint>& enum_table(GradCheckpoint) {
  static const config::EnumTable<GradCheckpoint> t{{GradCheckpoint::none, "none"}, {GradCheckpoint::blocks, "blocks"}};
  return t;
}

const config::EnumTable<LrSchedule>& enum_table(LrSchedule) {
  static const config::EnumTable<LrSchedule> t{{LrSchedule::cosine, "cosine"}, {LrSchedule::constant, "constant"}};
  return t;
}

const config::EnumTable<ScheduleUnit>& enum_table(ScheduleUnit) {
  static const config::EnumTable<ScheduleUnit> t{{ScheduleUnit::epoch, "epoch"}, {ScheduleUnit::step, "step"}};
  return t;
}

void OptimConfig::validate(const config::RuleError& bad) const {
  if (!(lr > 0)) bad("optim.lr", "must be > 0, got " + std::to_string(lr), "e.g. 1e-3");
  if (weight_decay < 0) bad("optim.weight_decay", "must be >= 0", "e.g. 0.05");
  if (betas.size() != 2 || !(betas[0] >= 0 && betas[0] < 1) || !(betas[1] >= 0 && betas[1] < 1))
    bad("optim.betas", "expected two numbers in [0, 1)", "e.g. [0.9, 0.999]");
  if (!(eps > 0)) bad("optim.eps", "must be > 0", "e.g. 1e-8");
  if (clip_grad < 0) bad("optim.clip_grad", "must be >= 0 (0 = off)", "e.g. 1.0");
}

void ScheduleConfig::validate(const config::RuleError& bad) const {
  if (warmup_epochs < 0) bad("schedule.warmup_epochs", "must be >= 0", "");
  if (warmup_lr < 0) bad("schedule.warmup_lr", "must be >= 0", "");
}

void TrainConfig::validate(const config::RuleError& bad) const {
  if (epochs <= 0) bad("train.epochs", "must be > 0", "");
  if (accum_steps <= 0) bad("train.accum_steps", "must be >= 1", "");
  if (processes < 1 || processes > 512) bad("train.processes", "must be in 1..512", "1 = this process only");
  if (moh_loss_coeff < 0) bad("train.moh_loss_coeff", "must be >= 0", "the paper uses 0.01");
  if (!(ema_decay >= 0 && ema_decay < 1)) bad("train.ema_decay", "must be in [0, 1)", "e.g. 0.9999");
  if (ckpt_every_epochs <= 0) bad("train.ckpt_every_epochs", "must be >= 1", "");
  if (ckpt_every_steps < 0) bad("train.ckpt_every_steps", "must be >= 0 (0 = at epoch ends only)", "e.g. 50000");
  if (max_nonfinite_steps < 0) bad("train.max_nonfinite_steps", "must be >= 0 (0 = never stop)", "e.g. 10");
  if (keep_last < 0) bad("train.keep_last", "must be >= 0 (0 = keep every checkpoint)", "e.g. 3");
  if (keep_every_steps < 0) bad("train.keep_every_steps", "must be >= 0 (0 = no milestones)", "e.g. 50000");
  if (log_every_steps <= 0) bad("train.log_every_steps", "must be >= 1", "");
  if (!(label_smoothing >= 0 && label_smoothing < 1)) bad("train.label_smoothing", "must be in [0, 1)", "");
  if (eval_every_epochs <= 0) bad("train.eval_every_epochs", "must be >= 1", "");
  if (max_steps < 0) bad("train.max_steps", "must be >= 0 (0 = no limit)", "");
  if (!(device == "auto" || device == "cpu" || device == "cuda" || device.rfind("cuda:", 0) == 0))
    bad("train.device", "expected auto, cpu, cuda or cuda:N, got \"" + device + "\"", "");
}

}  // namespace moh
