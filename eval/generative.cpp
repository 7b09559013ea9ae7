#include "eval/generative.h"

#include <algorithm>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "core/error.h"
#include "core/io/atomic_io.h"
#include "core/io/sha256.h"
#include "core/json_read.h"
#include "core/platform/memory_preflight.h"
#include "core/platform/run_context.h"
#include "datasets/npz.h"
#include "eval/metrics.h"

namespace moh::eval {

namespace {

at::Tensor json_bytes(const nlohmann::json& j) {
  const std::string s = j.dump();
  return at::from_blob(const_cast<char*>(s.data()), {static_cast<int64_t>(s.size())}, at::kByte).clone();
}

nlohmann::json bytes_json(const at::Tensor& t, const std::string& origin) {
  const at::Tensor c = t.to(at::kByte).contiguous();
  const std::string s(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.numel()));
  const std::string hint = "regenerate it with moh ref-stats";
  const nlohmann::json meta = parse_json(s, origin + ": member meta", hint);
  if (!meta.is_object())
    throw UserError(origin + ": member meta", "is not the statistics' record (not an object)", hint);
  read_json_fields(origin + ": member meta", "the statistics' record", hint, [&] {  // the fields read of it
    (void)meta.value("count", int64_t{0});
    (void)meta.value("feature_net", std::string());
    (void)meta.value("weights_sha256", std::string());
    return 0;
  });
  return meta;
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

namespace {

// The computations, each writing the keys of its records.
void compute_fid(const MetricInputs& in, nlohmann::json& out) {
  out["fid"] = frechet_distance(compute_stats(in.samples.pool), in.reference.pool);
}
void compute_sfid(const MetricInputs& in, nlohmann::json& out) {
  out["sfid"] = frechet_distance(compute_stats(in.samples.spatial), in.reference.spatial);
}
void compute_is(const MetricInputs& in, nlohmann::json& out) {
  const ISResult r = inception_score(in.samples.logits, in.is_mode);
  out["inception_score"] = r.mean;
  if (in.is_mode == ISMode::fidelity) out["inception_score_std"] = r.std;
}
void compute_pr(const MetricInputs& in, nlohmann::json& out) {
  const PRResult r = precision_recall(in.reference.pr_features, in.samples.pool);
  out["precision"] = r.precision;
  out["recall"] = r.recall;
}
void compute_kid(const MetricInputs& in, nlohmann::json& out) {  // torch-fidelity's protocol on the P/R rows
  const KIDResult r = kernel_inception_distance(in.samples.pool, in.reference.pr_features);
  out["kid_mean"] = r.mean;
  out["kid_std"] = r.std;
  out["kid_subsets"] = r.subsets;
  out["kid_subset_size"] = r.subset_size;
}

}  // namespace

const std::vector<MetricComputation>& metric_computations() {
  using F = SampleFeature;
  using R = ReferenceStat;
  const std::string k = std::to_string(kPRNeighbourhood);
  static const std::vector<MetricComputation> table{
      {MetricGroup::fid, {F::pool, R::pool_stats, 2, "FID needs at least 2 images", true}, compute_fid},
      {MetricGroup::sfid, {F::spatial, R::spatial_stats, 2, "sFID needs at least 2 images", true}, compute_sfid},
      {MetricGroup::is, {F::logits, R::none, 1, "IS needs at least 1 image", false}, compute_is},
      {MetricGroup::pr,
       {F::pool, R::pr_rows, kPRNeighbourhood + 1, "precision/recall need more than k = " + k + " images per set",
        false, true},
       compute_pr},
      {MetricGroup::kid, {F::pool, R::pr_rows, 2, "KID needs at least 2 images per set", false}, compute_kid},
  };
  return table;
}

MetricSet::MetricSet() {
  for (const MetricComputation& c : metric_computations()) on.insert(c.group);
}

MetricSet parse_metric_set(const std::string& list) {
  // The words: each generative group of the metric records once, in their order, and "all".
  std::vector<std::pair<std::string, MetricGroup>> words;
  for (const MetricRecord& r : metric_records())
    if (r.group != MetricGroup::classification && (words.empty() || words.back().second != r.group))
      words.emplace_back(group_word(r.group), r.group);
  std::vector<std::string> names;
  for (const auto& w : words) names.push_back(w.first);
  names.emplace_back("all");
  MetricSet m;
  m.on.clear();
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    const auto it = std::find_if(words.begin(), words.end(), [&](const auto& w) { return w.first == item; });
    if (it != words.end()) {
      m.on.insert(it->second);
    } else if (item == "all") {
      m = MetricSet{};
    } else {
      const std::string near = nearest_name(item, names);
      std::string all;
      for (const auto& n : names) all += (all.empty() ? "" : ",") + n;
      throw UserError("--metrics " + list, "unknown metric '" + item + "'",
                      near.empty() ? "choose from " + all : "did you mean '" + near + "'?");
    }
  }
  if (m.on.empty()) throw UserError("--metrics", "no metric selected", "e.g. fid,sfid,is,pr,kid");
  return m;
}

ReferenceStats reference_stats_from(const FeatureSet& features, const FeatureNet& net) {
  ReferenceStats r;
  r.pool = compute_stats(features.pool);
  if (features.spatial.defined()) r.spatial = compute_stats(features.spatial);
  r.pr_features = features.pool.narrow(0, 0, std::min<int64_t>(kPRReferenceRows, features.pool.size(0))).clone();
  r.count = features.pool.size(0);
  r.meta = net_meta(net);
  r.meta["count"] = r.count;
  return r;
}

void save_reference_stats(const std::string& path, const ReferenceStats& stats) {
  std::map<std::string, at::Tensor> arrays{{"mu", stats.pool.mu},
                                           {"sigma", stats.pool.sigma},
                                           {"pr_pool", stats.pr_features.to(at::kFloat)},
                                           {"meta", json_bytes(stats.meta)}};
  if (stats.spatial.mu.defined()) arrays["mu_s"] = stats.spatial.mu, arrays["sigma_s"] = stats.spatial.sigma;
  datasets::save_npz(path, arrays);
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

namespace {

/// The computations asked for, in their order.
std::vector<const MetricComputation*> asked(const MetricSet& m) {
  std::vector<const MetricComputation*> out;
  for (const MetricComputation& c : metric_computations())
    if (m.has(c.group)) out.push_back(&c);
  return out;
}

/// Whether stored statistics hold what a computation reads of the reference.
bool stored_has(const ReferenceStats& st, ReferenceStat need) {
  switch (need) {
    case ReferenceStat::pool_stats:
      return st.pool.mu.defined();
    case ReferenceStat::spatial_stats:
      return st.spatial.mu.defined();
    case ReferenceStat::pr_rows:
      return st.pr_features.defined();
    case ReferenceStat::none:
      break;
  }
  return true;
}

/// The reference side of an evaluation: stored statistics (ADM batches, moh ref-stats) and/or images to run through
/// the net for what the statistics lack.
struct ReferenceInputs {
  std::optional<ReferenceStats> stored;
  std::unique_ptr<datasets::ImageSource> images;
};

/// Opens --ref: stored statistics are reused (ADM) if they were made by this feature network; images are opened only
/// when a metric needs what the statistics lack.
ReferenceInputs open_reference(const GenerativeEvalOptions& o, const FeatureNet& net) {
  ReferenceInputs r;
  if (datasets::is_npz_spec(o.reference)) r.stored = load_reference_stats(o.reference);
  if (r.stored) {
    const nlohmann::json& meta = r.stored->meta;
    if (meta.empty() && net.name() != "inception")
      throw UserError("--ref " + o.reference,
                      "holds statistics of an unknown feature network (ADM files are Inception)",
                      "use --features inception:... or compute stats with moh ref-stats --features " + o.features);
    if (!meta.empty() &&
        (meta.value("feature_net", "") != net.name() || meta.value("weights_sha256", "") != net.weights_sha256()))
      throw UserError("--ref " + o.reference,
                      "statistics were computed with " + meta.value("feature_net", std::string("?")) + " (weights " +
                          meta.value("weights_sha256", std::string("?")).substr(0, 12) + "), not " + net.name() + " (" +
                          net.weights_sha256().substr(0, 12) + ")",
                      "recompute them with moh ref-stats using the same --features");
  }
  std::string lacking, given;  // the asked groups the stored statistics cannot serve, and those they can
  for (const MetricComputation* c : asked(o.metrics))
    (r.stored && stored_has(*r.stored, c->needs.reference) ? given : lacking) +=
        std::string(lacking.empty() && given.empty() ? "" : ",") + group_word(c->group);
  if (r.stored && lacking.empty()) return r;
  try {
    r.images = datasets::open_image_source(o.reference);
  } catch (const UserError&) {
    if (!r.stored) throw;
    throw UserError("--ref " + o.reference, "has statistics but no images for " + lacking,
                    given.empty() ? "give the reference images" : "use --metrics " + given);
  }
  return r;
}

/// Enough images for what was asked: a covariance needs 2, the k-NN manifolds of P/R more than k per set.
void check_counts(const GenerativeEvalOptions& o, int64_t n_samples, const ReferenceInputs& r) {
  const int64_t n_pr_ref = r.stored && r.stored->pr_features.defined() ? r.stored->pr_features.size(0)
                           : r.images                                  ? std::min(r.images->size(), kPRReferenceRows)
                                                                       : 0;
  for (const MetricComputation* c : asked(o.metrics)) {
    const MetricNeeds& n = c->needs;
    const bool samples_short = n_samples < n.min_images;
    if (!samples_short && (n.reference != ReferenceStat::pr_rows || n_pr_ref >= n.min_images)) continue;
    throw UserError(samples_short ? "--samples " + o.samples : "--ref " + o.reference,
                    n.too_few + ", got " + std::to_string(samples_short ? n_samples : n_pr_ref),
                    std::string("use more images or leave ") + group_word(c->group) + " out of --metrics");
  }
}

/// Labels and statistic widths against the net's output widths (one probe image through the net, no progress);
/// returns the probe's features (their widths size the memory check).
InceptionFeatures check_widths(const GenerativeEvalOptions& o, FeatureNet& net, const datasets::ImageSource& samples,
                               const ReferenceInputs& r) {
  const InceptionFeatures probe = net.extract(at::zeros({1, 32, 32, 3}, at::kByte));
  const at::Tensor labels = samples.labels();
  if (labels.defined() && labels.numel() > 0 && net.predicts_dataset_classes()) {
    const int64_t lo = labels.min().item<int64_t>(), hi = labels.max().item<int64_t>();
    if (lo < 0 || hi >= probe.logits.size(1))
      throw UserError("--samples " + o.samples,
                      "labels (arr_1) range over " + std::to_string(lo) + ".." + std::to_string(hi) +
                          ", the feature network has " + std::to_string(probe.logits.size(1)) + " classes",
                      "samples of another dataset?");
  }
  if (!r.stored) return probe;
  // A statistic's width: mu (D), mu_s (Ds), pr_features (rows, D).
  const auto width = [&](const at::Tensor& stat, const at::Tensor& features, const char* key) {
    const int64_t dims = stat.defined() ? stat.size(stat.dim() - 1) : 0;
    if (stat.defined() && dims != features.size(1))
      throw UserError("--ref " + o.reference,
                      std::string(key) + " has " + std::to_string(dims) + " dims, the feature network gives " +
                          std::to_string(features.size(1)),
                      "statistics of another feature network");
  };
  for (const MetricComputation* c : asked(o.metrics)) {
    const ReferenceStat need = c->needs.reference;
    if (need == ReferenceStat::pool_stats) width(r.stored->pool.mu, probe.pool, "mu");
    if (need == ReferenceStat::spatial_stats) width(r.stored->spatial.mu, probe.spatial, "mu_s");
    if (need == ReferenceStat::pr_rows) width(r.stored->pr_features, probe.pool, "pr_features");
  }
  return probe;
}

/// Bytes the precision/recall pass needs beside the features: one block of distances (kPRBlockBytes, or n² floats for
/// fewer rows) times what a block costs with its temporaries, measured on a small block (the k-th value's sort copies
/// the block, with int64 indices: about 5 blocks on LibTorch 1.13).
double pr_pass_bytes(int64_t n_max, int64_t width) {
  const int64_t n = 4096;
  const at::Tensor f = at::arange(n * width, at::kFloat).reshape({n, width}).remainder(251);  // any values will do
  const double before = peak_memory_during([] {}, c10::kCPU);
  const double peak = peak_memory_during([&] { manifold_radii(f); }, c10::kCPU);
  const double per_block_byte = std::max(0.0, peak - before) / (4.0 * static_cast<double>(n * n));
  const double block = std::min(static_cast<double>(kPRBlockBytes), 4.0 * static_cast<double>(n_max * n_max));
  return per_block_byte * block;
}

/// What a host evaluation holds whatever its batch: every image's features (fp32) beside the forward, and after the
/// last forward the largest of: the samples' twice while their batches are joined, the reference's beside them, the
/// metrics' own (the float64 copies of the statistics and KID, the precision/recall pass).
void hold_features(MemoryProbe& probe, const GenerativeEvalOptions& o, const InceptionFeatures& f, int64_t n_samples,
                   int64_t n_reference) {
  int64_t width = 0, widest = 0;
  for (const at::Tensor* t : {&f.pool, &f.spatial, &f.logits})
    if (t->defined()) width += t->size(1), widest = std::max(widest, t->size(1));
  const double s = 4.0 * static_cast<double>(n_samples * width), r = 4.0 * static_cast<double>(n_reference * width);
  double metrics = 16.0 * static_cast<double>((n_samples + n_reference) * widest);
  const auto asked_list = asked(o.metrics);
  if (std::any_of(asked_list.begin(), asked_list.end(), [](const MetricComputation* c) { return c->needs.distances; }))
    metrics = std::max(metrics, pr_pass_bytes(std::max(n_samples, n_reference), f.pool.size(1)));
  probe.held = s + r;
  probe.after = "the metrics";
  probe.held_after = std::max({2 * s, s + 2 * r, s + r + metrics});
}

/// The memory check of an evaluation (core/platform/memory_preflight.h), before the first feature is extracted: the
/// feature network's forward at a batch of blank images of the samples' size, with the next batch read beside it (as
/// extract_features runs), plus the features it holds.
std::string check_generative_memory(const GenerativeEvalOptions& o, FeatureNet& net, const InceptionFeatures& probe_f,
                                    const datasets::ImageSource& samples, const ReferenceInputs& refs) {
  if (memory_check_skipped()) return "";  // the precision/recall probe below is the check's own work
  const int64_t n_samples = samples.size();
  datasets::ImageBlock first;
  if (!samples.fresh()->next(1, first)) return "";
  const std::vector<int64_t> shape = first.images.sizes().vec();  // (1, H, W, C)
  const int64_t n_ref = refs.images ? refs.images->size() : 0;
  MemoryPlan plan;
  plan.batch = std::min(o.batch_size, std::max(n_samples, n_ref));  // a batch is never larger than its set
  plan.setting = "--batch";
  MemoryProbe probe;
  probe.what = "evaluating " + std::to_string(n_samples) + " samples with " + net.name();
  probe.step = "features";
  // The forward is measured from half the run's batch (at most 512 images; measure_memory_need halves it again when
  // one forward is slow), and extrapolated from there to the run's batch, 100-fold for a batch of 60,000: its slope
  // must be the forward's own, so every allocation of the probe is mapped on its own (live_set).
  probe.probe_batch = std::clamp<int64_t>(plan.batch / 2, 16, 512);
  probe.live_set = true;
  probe.other = "the number of samples or reference images (the features of every image are held)";
  // The features and the metrics live on the host: with the net on a GPU the check is its forward's.
  if (net.device().is_cpu()) hold_features(probe, o, probe_f, n_samples, n_ref);
  probe.build = [&net, shape](const RunContext&, int64_t batch) {
    return std::function<void()>([&net, shape, batch] {
      const at::Tensor images = at::zeros({batch, shape[1], shape[2], shape[3]}, at::kByte);
      const at::Tensor next = at::zeros_like(images);  // the reader's next batch
      net.extract(images);
    });
  };
  RunContext ctx;
  ctx.device = net.device();
  return preflight_memory(probe, ctx, plan).line;
}

/// The reference statistics: stored ones completed by those computed from `rf` (features of the reference images).
ReferenceStats complete_reference(const ReferenceInputs& r, const FeatureSet& rf, const FeatureNet& net) {
  if (!rf.pool.defined()) return *r.stored;
  ReferenceStats computed = reference_stats_from(rf, net);
  if (!r.stored) return computed;
  ReferenceStats ref = *r.stored;
  if (!ref.spatial.mu.defined()) ref.spatial = computed.spatial;
  if (!ref.pr_features.defined()) ref.pr_features = computed.pr_features;
  if (!ref.count) ref.count = computed.count;
  return ref;
}

nlohmann::json compute_metrics(const GenerativeEvalOptions& o, const FeatureSet& s, const ReferenceStats& ref) {
  nlohmann::json metrics = nlohmann::json::object();
  const MetricInputs in{s, ref, o.is_mode};
  for (const MetricComputation* c : asked(o.metrics)) c->compute(in, metrics);
  return metrics;
}

void save_features(const std::string& path, const FeatureSet& s, const FeatureSet& rf) {
  std::map<std::string, at::Tensor> arrays{{"pool", s.pool}};
  const auto put = [&](const char* key, const at::Tensor& t) {
    if (t.defined()) arrays[key] = t;
  };
  put("spatial", s.spatial), put("logits", s.logits), put("labels", s.labels);
  put("ref_pool", rf.pool), put("ref_spatial", rf.spatial), put("ref_logits", rf.logits);
  datasets::save_npz(path, arrays);
}

// How the samples were made, when `moh sample` wrote them: the sampling.json beside SAMPLES.npz, if it was written
// after the samples and counts as many (a later run that stopped between the two files leaves an older one); else null.
nlohmann::json sampling_record(const std::string& samples, int64_t count) {
  namespace fs = std::filesystem;
  const fs::path record = fs::path(samples).parent_path() / "sampling.json";
  std::error_code ec;
  if (!fs::is_regular_file(samples, ec) || !fs::is_regular_file(record, ec)) return nullptr;
  if (fs::last_write_time(record, ec) < fs::last_write_time(samples, ec) || ec) return nullptr;
  try {
    nlohmann::json j = nlohmann::json::parse(read_file(record.string()));
    return j.value("count", int64_t{-1}) == count ? j : nlohmann::json();
  } catch (const std::exception&) {
    return nullptr;  // not ours to judge: the metrics do not depend on it
  }
}

nlohmann::json describe_run(const GenerativeEvalOptions& o, const FeatureNet& net, const FeatureSet& s,
                            const ReferenceStats& ref, bool ref_stored) {
  nlohmann::json report;
  if (net.predicts_dataset_classes() && s.labels.defined()) {
    const at::Tensor pred = s.logits.argmax(1);
    report["sample_accuracy"] = {{"top1", pred.eq(s.labels).to(at::kDouble).mean().item<double>() * 100.0},
                                 {"count", s.labels.size(0)}};
  }
  report["samples"] = {{"path", o.samples},
                       {"count", s.pool.size(0)},
                       {"labelled", s.labels.defined()},
                       {"sampling", sampling_record(o.samples, s.pool.size(0))}};
  report["reference"] = {{"path", o.reference},
                         {"count", ref.count},
                         {"statistics", ref_stored ? "stored" : "computed"},
                         {"pr_rows", ref.pr_features.defined() ? ref.pr_features.size(0) : 0}};
  // Which reference file the numbers are against (a dataset spec or a folder has no one hash: null).
  report["reference"]["sha256"] =
      std::filesystem::is_regular_file(o.reference) ? nlohmann::json(sha256_file(o.reference)) : nlohmann::json();
  report["feature_net"] = net_meta(net);
  report["feature_net"]["spec"] = o.features;
  report["provenance"] = provenance(net.device());
  report["is_mode"] =
      o.is_mode == ISMode::adm ? "adm (splits of 5000, in order)" : "torch-fidelity (10 shuffled splits)";
  report["pr_distances"] = "float32 squared L2 (ADM uses fp16 when finite)";
  return report;
}

}  // namespace

namespace {

// The metrics `net` can give (their needs: sFID spatial features, IS logits); asked for by name, a missing one is a
// UserError, left out otherwise (the default "all").
GenerativeEvalOptions for_net(GenerativeEvalOptions o, const FeatureNet& net) {
  for (const MetricComputation* c : asked(o.metrics)) {
    const SampleFeature f = c->needs.features;
    if ((f != SampleFeature::spatial || net.has_spatial()) && (f != SampleFeature::logits || net.has_logits()))
      continue;
    const std::string word = group_word(c->group);
    if (o.metrics_explicit)
      throw UserError("--metrics " + word, net.name() + " features have no " + word + " input",
                      "fid, pr and kid apply to every feature network");
    o.metrics.on.erase(c->group);
  }
  return o;
}

}  // namespace

nlohmann::json evaluate_generative(const GenerativeEvalOptions& options, FeatureNet& net) {
  return evaluate_generative(options, net, datasets::open_image_source(options.samples));
}

nlohmann::json evaluate_generative(const GenerativeEvalOptions& options, FeatureNet& net,
                                   std::unique_ptr<datasets::ImageSource> samples) {
  const auto start = std::chrono::steady_clock::now();
  const GenerativeEvalOptions o = for_net(options, net);
  const ReferenceInputs refs = open_reference(o, net);
  check_counts(o, samples->size(), refs);
  const InceptionFeatures probe = check_widths(o, net, *samples, refs);
  const std::string memory = check_generative_memory(o, net, probe, *samples, refs);
  if (!memory.empty()) std::cerr << memory << "\n";  // every input check is done before the first feature is extracted

  const FeatureSet s = extract_features(net, *samples, o.batch_size, "samples");
  const std::string net_hint = "the feature network's weights (" + o.features + ") give non-finite outputs";
  check_finite(s.pool, "features of --samples " + o.samples, net_hint);
  if (s.logits.defined()) check_finite(s.logits, "logits of --samples " + o.samples, net_hint);
  FeatureSet rf;
  if (refs.images) {
    rf = extract_features(net, *refs.images, o.batch_size, "reference");
    check_finite(rf.pool, "features of --ref " + o.reference, net_hint);
  }
  const ReferenceStats ref = complete_reference(refs, rf, net);
  nlohmann::json report = describe_run(o, net, s, ref, refs.stored.has_value());
  const auto asked_list = asked(o.metrics);
  const bool covariance =
      std::any_of(asked_list.begin(), asked_list.end(), [](const MetricComputation* c) { return c->needs.covariance; });
  if (covariance && s.pool.size(0) < s.pool.size(1)) {
    const std::string w = "FID from " + std::to_string(s.pool.size(0)) + " samples with " +
                          std::to_string(s.pool.size(1)) +
                          "-dim features: the sample covariance is singular and the value is biased high; compare "
                          "only numbers computed with the same N (ADM uses 50000)";
    std::cerr << "warning: " << w << "\n";
    report["warnings"] = {w};
  }
  report["metrics"] = compute_metrics(o, s, ref);
  if (!o.save_features.empty()) {
    save_features(o.save_features, s, rf);
    report["saved_features"] = o.save_features;
  }
  report["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace moh::eval
