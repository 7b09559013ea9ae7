#include "vision/nn/model_config.h"

#include "core/error.h"

namespace moh {

const config::EnumTable<AttentionMode>& enum_table(AttentionMode) {
  static const config::EnumTable<AttentionMode> t{
      {AttentionMode::mha, "mha"}, {AttentionMode::moh, "moh"}, {AttentionMode::moa, "moa"}};
  return t;
}

const config::EnumTable<AttentionPath>& enum_table(AttentionPath) {
  static const config::EnumTable<AttentionPath> t{
      {AttentionPath::dense, "dense"}, {AttentionPath::sparse, "sparse"}, {AttentionPath::automatic, "auto"}};
  return t;
}

const config::EnumTable<RouterKind>& enum_table(RouterKind) {
  static const config::EnumTable<RouterKind> t{{RouterKind::learned, "learned"},
                                               {RouterKind::query_norm, "query_norm"}};
  return t;
}

std::vector<HeadSplit> moh_split(const ModelConfig& model, const std::vector<int64_t>& heads, bool one_for_all,
                                 const std::string& unit) {
  const auto& s = model.shared_heads;
  const auto& k = model.topk;
  if (s.empty() && k.empty()) return {};
  const std::string what = "config: model.shared_heads / model.topk";
  if (s.size() != k.size())
    throw UserError(
        what, "give both with the same length (" + std::to_string(s.size()) + " vs " + std::to_string(k.size()) + ")",
        "e.g. shared_heads: [8], topk: [4]");
  const size_t n = heads.size();
  if (s.size() != n && !(one_for_all && s.size() == 1))
    throw UserError(what,
                    "expected " + std::to_string(n) + " values (one per " + unit + ")" +
                        (one_for_all ? " or one for every " + unit : "") + ", got " + std::to_string(s.size()),
                    "");
  std::vector<HeadSplit> out;
  for (size_t i = 0; i < n; ++i) {
    const size_t j = s.size() == 1 ? 0 : i;
    const int64_t h = heads[i], hs = s[j], kk = k[j];
    const std::string where = unit + " " + std::to_string(i + 1) + " (" + std::to_string(h) + " heads)";
    if (hs < 0 || hs > h || kk < 0 || kk > h - hs)
      throw UserError(what,
                      where + ": shared " + std::to_string(hs) + ", top-K " + std::to_string(kk) +
                          " do not fit (0 ≤ shared ≤ heads, 0 ≤ K ≤ heads − shared)",
                      "");
    if (kk == 0 && hs != h)
      throw UserError(what, where + ": K = 0 weights every head, so shared must be " + std::to_string(h),
                      "or give K > 0");
    out.push_back({hs, kk});
  }
  return out;
}

}  // namespace moh
