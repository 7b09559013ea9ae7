#include "eval/generative.h"

#include <chrono>
#include <iostream>
#include <sstream>

#include "core/error.h"
#include "datasets/npz.h"

namespace moh::eval {

namespace {

at::Tensor json_bytes(const nlohmann::json& j) {
  const std::string s = j.dump();
  return at::from_blob(const_cast<char*>(s.data()), {static_cast<int64_t>(s.size())}, at::kByte).clone();
}

nlohmann::json bytes_json(const at::Tensor& t, const std::string& origin) {
  const at::Tensor c = t.to(at::kByte).contiguous();
  const std::string s(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.numel()));
  try {
    return nlohmann::json::parse(s);
  } catch (const std::exception&) {
    throw UserError(origin, "member meta is not valid JSON", "regenerate it with moh ref-stats");
  }
}

nlohmann::json net_meta(const FeatureNet& net) {
  return {
      {"feature_net", net.name()}, {"weights_sha256", net.weights_sha256()}, {"preprocessing", net.preprocessing()}};
}

void check_square(const at::Tensor& sigma, const at::Tensor& mu, const std::string& origin, const std::string& key) {
  if (mu.dim() != 1 || sigma.dim() != 2 || sigma.size(0) != mu.size(0) || sigma.size(1) != mu.size(0))
    throw UserError(origin,
                    key + " has shape " + c10::str(sigma.sizes()) + " for a mean of shape " + c10::str(mu.sizes()),
                    "expected mu (D) and sigma (D, D)");
}

}  // namespace

MetricSet parse_metric_set(const std::string& list) {
  MetricSet m{false, false, false, false};
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item == "fid")
      m.fid = true;
    else if (item == "sfid")
      m.sfid = true;
    else if (item == "is")
      m.is = true;
    else if (item == "pr")
      m.pr = true;
    else if (item == "all")
      m = MetricSet{};
    else {
      const std::string near = nearest_name(item, {"fid", "sfid", "is", "pr", "all"});
      throw UserError("--metrics " + list, "unknown metric '" + item + "'",
                      near.empty() ? "choose from fid,sfid,is,pr,all" : "did you mean '" + near + "'?");
    }
  }
  if (!(m.fid || m.sfid || m.is || m.pr)) throw UserError("--metrics", "no metric selected", "e.g. fid,sfid,is,pr");
  return m;
}

ReferenceStats reference_stats_from(const FeatureSet& features, const FeatureNet& net) {
  ReferenceStats r;
  r.pool = compute_stats(features.pool);
  r.spatial = compute_stats(features.spatial);
  r.pr_features = features.pool.narrow(0, 0, std::min<int64_t>(kPRReferenceRows, features.pool.size(0))).clone();
  r.count = features.pool.size(0);
  r.meta = net_meta(net);
  r.meta["count"] = r.count;
  return r;
}

void save_reference_stats(const std::string& path, const ReferenceStats& stats) {
  datasets::save_npz(path, {{"mu", stats.pool.mu},
                            {"sigma", stats.pool.sigma},
                            {"mu_s", stats.spatial.mu},
                            {"sigma_s", stats.spatial.sigma},
                            {"pr_pool", stats.pr_features.to(at::kFloat)},
                            {"meta", json_bytes(stats.meta)}});
}

namespace {

// Statistics and features must be finite: NaN statistics would reach linalg.eigh, NaN features give NaN metrics.
void check_finite(const at::Tensor& t, const std::string& what, const std::string& hint) {
  if (t.defined() && t.numel() > 0 && !at::isfinite(t).all().item<bool>())
    throw UserError(what, "holds NaN or infinite values", hint);
}

}  // namespace

std::optional<ReferenceStats> load_reference_stats(const std::string& path) {
  datasets::NpzReader npz(path);
  if (!npz.has("mu") || !npz.has("sigma")) return std::nullopt;
  const std::string origin = "npz " + path;
  ReferenceStats r;
  r.pool = {npz.read("mu").to(at::kDouble), npz.read("sigma").to(at::kDouble)};
  check_square(r.pool.sigma, r.pool.mu, origin, "sigma");
  if (npz.has("mu_s") && npz.has("sigma_s")) {
    r.spatial = {npz.read("mu_s").to(at::kDouble), npz.read("sigma_s").to(at::kDouble)};
    check_square(r.spatial.sigma, r.spatial.mu, origin, "sigma_s");
  }
  if (npz.has("pr_pool")) {
    r.pr_features = npz.read("pr_pool").to(at::kFloat);
    if (r.pr_features.dim() != 2 || r.pr_features.size(1) != r.pool.mu.size(0))
      throw UserError(origin, "pr_pool does not match mu", "regenerate it with moh ref-stats");
  }
  if (npz.has("meta")) {
    r.meta = bytes_json(npz.read("meta"), origin);
    r.count = r.meta.value("count", int64_t{0});
  }
  const std::string regen = "regenerate it with moh ref-stats";
  check_finite(r.pool.mu, origin + ": mu", regen), check_finite(r.pool.sigma, origin + ": sigma", regen);
  check_finite(r.spatial.mu, origin + ": mu_s", regen), check_finite(r.spatial.sigma, origin + ": sigma_s", regen);
  check_finite(r.pr_features, origin + ": pr_pool", regen);
  return r;
}

nlohmann::json evaluate_generative(const GenerativeEvalOptions& o, const RunContext& ctx) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<FeatureNet> net = make_feature_net(o.features, ctx, o.resize);
  std::unique_ptr<datasets::ImageSource> samples = datasets::open_image_source(o.samples);

  // Reference: stored statistics are reused (ADM); images are only run through the net for what is missing.
  std::optional<ReferenceStats> stored;
  if (datasets::is_npz_spec(o.reference)) stored = load_reference_stats(o.reference);
  if (stored) {
    const bool foreign = stored->meta.empty();
    if (foreign && net->name() != "inception")
      throw UserError("--ref " + o.reference,
                      "holds statistics of an unknown feature network (ADM files are Inception)",
                      "use --features inception:... or compute stats with moh ref-stats --features " + o.features);
    if (!foreign && (stored->meta.value("feature_net", "") != net->name() ||
                     stored->meta.value("weights_sha256", "") != net->weights_sha256()))
      throw UserError("--ref " + o.reference,
                      "statistics were computed with " + stored->meta.value("feature_net", std::string("?")) +
                          " (weights " + stored->meta.value("weights_sha256", std::string("?")).substr(0, 12) +
                          "), not " + net->name() + " (" + net->weights_sha256().substr(0, 12) + ")",
                      "recompute them with moh ref-stats using the same --features");
  }
  const bool need_ref_images =
      !stored || (o.metrics.sfid && !stored->spatial.mu.defined()) || (o.metrics.pr && !stored->pr_features.defined());
  std::unique_ptr<datasets::ImageSource> ref_images;
  if (need_ref_images) {
    try {
      ref_images = datasets::open_image_source(o.reference);
    } catch (const UserError& e) {
      if (!stored) throw;
      throw UserError("--ref " + o.reference, "has statistics but no images for sfid/pr", "use --metrics fid,is");
    }
  }

  // Enough images for what was asked, before any feature is extracted: a covariance needs 2, the k-NN manifolds of
  // P/R more than k per set.
  const int64_t n_samples = samples->size();
  const int64_t n_pr_ref = stored && stored->pr_features.defined() ? stored->pr_features.size(0)
                           : ref_images                            ? std::min(ref_images->size(), kPRReferenceRows)
                                                                   : 0;
  if ((o.metrics.fid || o.metrics.sfid) && n_samples < 2)
    throw UserError("--samples " + o.samples, "FID needs at least 2 images, got " + std::to_string(n_samples), "");
  if (o.metrics.pr && (n_samples <= kPRNeighbourhood || n_pr_ref <= kPRNeighbourhood))
    throw UserError(n_samples <= kPRNeighbourhood ? "--samples " + o.samples : "--ref " + o.reference,
                    "precision/recall need more than k = " + std::to_string(kPRNeighbourhood) +
                        " images per set, got " + std::to_string(std::min(n_samples, n_pr_ref)),
                    "use more images or --metrics fid,sfid,is");
  FeatureSet s = extract_features(*net, *samples, o.batch_size, "samples");
  const std::string net_hint = "the feature network's weights (" + o.features + ") give non-finite outputs";
  check_finite(s.pool, "features of --samples " + o.samples, net_hint);
  check_finite(s.logits, "logits of --samples " + o.samples, net_hint);
  ReferenceStats ref;
  FeatureSet rf;
  std::string ref_origin = "stored";
  if (stored) ref = *stored;
  if (ref_images) {
    rf = extract_features(*net, *ref_images, o.batch_size, "reference");
    check_finite(rf.pool, "features of --ref " + o.reference, net_hint);
    ReferenceStats computed = reference_stats_from(rf, *net);
    if (!stored) {
      ref = computed;
      ref_origin = "computed";
    }
    if (!ref.spatial.mu.defined()) ref.spatial = computed.spatial;
    if (!ref.pr_features.defined()) ref.pr_features = computed.pr_features;
    if (!ref.count) ref.count = computed.count;
  }

  std::vector<std::string> warnings;
  if ((o.metrics.fid || o.metrics.sfid) && n_samples < s.pool.size(1))
    warnings.push_back("FID from " + std::to_string(n_samples) + " samples with " + std::to_string(s.pool.size(1)) +
                       "-dim features: the sample covariance is singular and the value is biased high; compare only "
                       "numbers computed with the same N (ADM uses 50000)");
  if (s.labels.defined() && net->predicts_dataset_classes() && s.labels.numel() > 0 &&
      (s.labels.min().item<int64_t>() < 0 || s.labels.max().item<int64_t>() >= s.logits.size(1)))
    throw UserError("--samples " + o.samples,
                    "labels (arr_1) range over " + std::to_string(s.labels.min().item<int64_t>()) + ".." +
                        std::to_string(s.labels.max().item<int64_t>()) + ", the feature network has " +
                        std::to_string(s.logits.size(1)) + " classes",
                    "samples of another dataset?");
  for (const auto& w : warnings) std::cerr << "warning: " << w << "\n";
  nlohmann::json metrics = nlohmann::json::object();
  if (o.metrics.fid) {
    if (ref.pool.mu.size(0) != s.pool.size(1))
      throw UserError(
          "--ref " + o.reference,
          "mu has " + std::to_string(ref.pool.mu.size(0)) + " dims, the features " + std::to_string(s.pool.size(1)),
          "statistics of another feature network");
    metrics["fid"] = frechet_distance(compute_stats(s.pool), ref.pool);
  }
  if (o.metrics.sfid) {
    if (ref.spatial.mu.size(0) != s.spatial.size(1))
      throw UserError("--ref " + o.reference,
                      "mu_s has " + std::to_string(ref.spatial.mu.size(0)) + " dims, the spatial features " +
                          std::to_string(s.spatial.size(1)),
                      "");
    metrics["sfid"] = frechet_distance(compute_stats(s.spatial), ref.spatial);
  }
  if (o.metrics.is) {
    const ISResult r = inception_score(s.logits, o.is_mode);
    metrics["inception_score"] = r.mean;
    if (o.is_mode == ISMode::fidelity) metrics["inception_score_std"] = r.std;
  }
  if (o.metrics.pr) {
    const PRResult r = precision_recall(ref.pr_features, s.pool);
    metrics["precision"] = r.precision;
    metrics["recall"] = r.recall;
  }
  nlohmann::json report;
  report["metrics"] = metrics;
  if (!warnings.empty()) report["warnings"] = warnings;
  if (net->predicts_dataset_classes() && s.labels.defined()) {
    const at::Tensor pred = s.logits.argmax(1);
    report["sample_accuracy"] = {{"top1", pred.eq(s.labels).to(at::kDouble).mean().item<double>() * 100.0},
                                 {"count", s.labels.size(0)}};
  }
  report["samples"] = {{"path", o.samples}, {"count", s.pool.size(0)}, {"labelled", s.labels.defined()}};
  report["reference"] = {{"path", o.reference},
                         {"count", ref.count},
                         {"statistics", ref_origin},
                         {"pr_rows", ref.pr_features.defined() ? ref.pr_features.size(0) : 0}};
  report["feature_net"] = net_meta(*net);
  report["feature_net"]["spec"] = o.features;
  report["is_mode"] =
      o.is_mode == ISMode::adm ? "adm (splits of 5000, in order)" : "torch-fidelity (10 shuffled splits)";
  report["pr_distances"] = "float32 squared L2 (ADM uses fp16 when finite)";

  if (!o.save_features.empty()) {
    std::map<std::string, at::Tensor> arrays{{"pool", s.pool}, {"spatial", s.spatial}, {"logits", s.logits}};
    if (s.labels.defined()) arrays["labels"] = s.labels;
    if (rf.pool.defined()) {
      arrays["ref_pool"] = rf.pool;
      arrays["ref_spatial"] = rf.spatial;
      arrays["ref_logits"] = rf.logits;
    }
    datasets::save_npz(o.save_features, arrays);
    report["saved_features"] = o.save_features;
  }
  report["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace moh::eval
