#include "vision/nn/model_config.h"

#include <ATen/ATen.h>

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

const config::EnumTable<FusedMode>& enum_table(FusedMode) {
  static const config::EnumTable<FusedMode> t{
      {FusedMode::automatic, "auto"}, {FusedMode::on, "on"}, {FusedMode::off, "off"}};
  return t;
}

const config::EnumTable<NormKind>& enum_table(NormKind) {
  static const config::EnumTable<NormKind> t{
      {NormKind::automatic, "auto"}, {NormKind::layernorm, "layernorm"}, {NormKind::rmsnorm, "rmsnorm"}};
  return t;
}

const config::EnumTable<MlpKind>& enum_table(MlpKind) {
  static const config::EnumTable<MlpKind> t{
      {MlpKind::automatic, "auto"}, {MlpKind::gelu, "gelu"}, {MlpKind::swiglu, "swiglu"}};
  return t;
}

const config::EnumTable<PosKind>& enum_table(PosKind) {
  static const config::EnumTable<PosKind> t{
      {PosKind::automatic, "auto"}, {PosKind::sincos, "sincos"}, {PosKind::rope2d, "rope2d"}};
  return t;
}

std::string head_split_error(int64_t heads, int64_t shared, int64_t topk) {
  const std::string given = "shared " + std::to_string(shared) + ", top-K " + std::to_string(topk);
  if (shared < 0 || shared > heads || topk < 0 || topk > heads - shared)
    return given + " do not fit (0 ≤ shared ≤ heads, 0 ≤ K ≤ heads − shared)";
  if (topk == 0 && shared != heads)
    return given + ": K = 0 weights every head, so shared must be " + std::to_string(heads) + " (or give K > 0)";
  return "";
}

void check_router(RouterKind router, bool has_moh_layers, const std::string& variant) {
  if (router == RouterKind::query_norm && !has_moh_layers)
    throw UserError("model.router", "query_norm routes the heads of MoH layers; this variant has none",
                    "pick a " + variant + " variant; a dense checkpoint loads into one with model.weights");
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
    if (const std::string why = head_split_error(h, hs, kk); !why.empty())
      throw UserError(what, unit + " " + std::to_string(i + 1) + " (" + std::to_string(h) + " heads): " + why, "");
    out.push_back({hs, kk});
  }
  return out;
}

void ModelConfig::validate(const config::RuleError& bad) const {
  if (num_classes < 0) bad("model.num_classes", "must be >= 0 (0 = variant default)", "");
  if (img_size < 0) bad("model.img_size", "must be >= 0 (0 = variant default)", "");
  if (img_size > kMaxImageSize)
    bad("model.img_size", "must be <= " + std::to_string(kMaxImageSize) + " px, got " + std::to_string(img_size), "");
  if (drop_path >= 1) bad("model.drop_path", "must be < 1", "e.g. 0.1");
  // The weights' companions mean nothing alone: set without model.weights they would be ignored.
  if (weights.empty() && !weights_key.empty())
    bad("model.weights_key", "is set but model.weights is not", "give the file too: --weights FILE --weights-key KEY");
  if (weights.empty() && weights_allow_missing)
    bad("model.weights_allow_missing", "is set but model.weights is not", "give the file too: --weights FILE");
}

uint64_t module_seed(int64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  uint64_t z = h + 0x9e3779b97f4a7c15ull * (static_cast<uint64_t>(seed) + 1);  // SplitMix64's finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (z ^ (z >> 31)) >> 1;  // 63 bits: a non-negative seed
}

void seed_for_module(int64_t seed, const std::string& name) {
  if (seed >= 0) at::manual_seed(module_seed(seed, name));
}

}  // namespace moh
