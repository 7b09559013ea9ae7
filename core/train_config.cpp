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

}  // namespace moh
