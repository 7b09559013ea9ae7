// The metrics of `moh fid` in torch.ops.moh (moh_torch.metrics): the whole report through the command's own library
// call (experiments::evaluate_sample_set: the same feature net, the same numbers), and the ADM-exact pieces on
// feature arrays a user already has (eval/frechet.h, eval/metrics.h).
#include <optional>
#include <string>
#include <tuple>

#include "core/config_schema.h"
#include "core/error.h"
#include "datasets/image_source.h"
#include "eval/frechet.h"
#include "eval/generative.h"
#include "eval/metrics.h"
#include "experiments/evaluation_run.h"
#include "python/csrc/ops.h"

namespace moh::torch_ops {

namespace {

// A UserError of the toolkit as a Python ValueError with the command's one line (without "error: ").
template <class F>
auto user_errors_as_value_errors(const char* op, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const UserError& e) {
    TORCH_CHECK_VALUE(false, "moh::", op, ": ", e.what());
  }
  return decltype(f())();
}

eval::GenerativeEvalOptions fid_options(c10::string_view samples, c10::string_view reference, c10::string_view features,
                                        c10::string_view metrics, c10::string_view is_mode, c10::string_view resize,
                                        int64_t batch_size) {
  eval::GenerativeEvalOptions o;
  o.samples = std::string(samples), o.reference = std::string(reference), o.features = std::string(features);
  o.metrics = eval::parse_metric_set(std::string(metrics));
  o.metrics_explicit = std::string(metrics) != "all";
  o.is_mode = config::enum_from_string<eval::ISMode>(std::string(is_mode), "is_mode");
  o.resize = config::enum_from_string<eval::InceptionResize>(std::string(resize), "resize");
  if (batch_size < 1) throw UserError("batch_size", "must be at least 1, got " + std::to_string(batch_size));
  o.batch_size = batch_size;
  return o;
}

std::string fid_report(c10::string_view samples, c10::string_view reference, c10::string_view features,
                       c10::string_view metrics, c10::string_view is_mode, c10::string_view resize, int64_t batch_size,
                       c10::string_view device) {
  return user_errors_as_value_errors("fid_report", [&] {
    const auto o = fid_options(samples, reference, features, metrics, is_mode, resize, batch_size);
    return experiments::evaluate_sample_set(o, std::string(device), "").dump();
  });
}

// The samples from the caller's memory, a block of batch_size images at a time: no copy of the set on disk or in RAM.
std::string fid_report_images(const at::Tensor& samples, c10::string_view reference, c10::string_view features,
                              c10::string_view metrics, c10::string_view is_mode, c10::string_view resize,
                              int64_t batch_size, c10::string_view device) {
  return user_errors_as_value_errors("fid_report", [&] {
    const std::string name = c10::str("<", samples.dim() > 0 ? samples.size(0) : 0, " images in memory>");
    const auto o = fid_options(name, reference, features, metrics, is_mode, resize, batch_size);
    return experiments::evaluate_sample_set(o, std::string(device), "", datasets::tensor_image_source(samples, name))
        .dump();
  });
}

void check_features(const char* op, const char* name, const at::Tensor& t) {
  check_dims(op, name, t, 2, "(N, D)");
  TORCH_CHECK_TYPE(t.is_floating_point(), "moh::", op, ": ", name, " must be floating point, got ", t.scalar_type());
}

double frechet_distance(const at::Tensor& mu1, const at::Tensor& sigma1, const at::Tensor& mu2,
                        const at::Tensor& sigma2) {
  constexpr const char* op = "frechet_distance";
  check_dims(op, "mu1", mu1, 1, "(D)");
  const int64_t D = mu1.size(0);
  check_sizes(op, "sigma1", sigma1, {D, D}, "(D, D)");
  check_sizes(op, "mu2", mu2, {D}, "(D)");
  check_sizes(op, "sigma2", sigma2, {D, D}, "(D, D)");
  auto f64 = [](const at::Tensor& t) { return t.to(at::kCPU, at::kDouble).contiguous(); };
  return eval::frechet_distance({f64(mu1), f64(sigma1)}, {f64(mu2), f64(sigma2)});
}

std::tuple<at::Tensor, at::Tensor> gaussian_stats(const at::Tensor& features) {
  check_features("gaussian_stats", "features", features);
  TORCH_CHECK_VALUE(features.size(0) >= 2, "moh::gaussian_stats: features needs at least 2 rows, got ",
                    features.size(0));
  const eval::GaussianStats s = eval::compute_stats(features.cpu());
  return {s.mu, s.sigma};
}

std::tuple<double, double> inception_score(const at::Tensor& logits, c10::string_view mode) {
  check_features("inception_score", "logits", logits);
  return user_errors_as_value_errors("inception_score", [&] {
    const auto m = config::enum_from_string<eval::ISMode>(std::string(mode), "mode");
    const eval::ISResult r = eval::inception_score(logits.cpu(), m);
    return std::tuple<double, double>{r.mean, r.std};
  });
}

std::tuple<double, double> precision_recall(const at::Tensor& reference, const at::Tensor& samples) {
  check_features("precision_recall", "reference", reference);
  check_features("precision_recall", "samples", samples);
  TORCH_CHECK_VALUE(samples.size(1) == reference.size(1), "moh::precision_recall: samples must have reference's ",
                    reference.size(1), " columns, got ", samples.size(1));
  TORCH_CHECK_VALUE(reference.size(0) > eval::kPRNeighbourhood && samples.size(0) > eval::kPRNeighbourhood,
                    "moh::precision_recall: each set needs more than ", eval::kPRNeighbourhood, " rows");
  const eval::PRResult r = eval::precision_recall(reference.cpu().to(at::kFloat), samples.cpu().to(at::kFloat));
  return {r.precision, r.recall};
}

std::tuple<double, double> kid(const at::Tensor& a, const at::Tensor& b, int64_t subsets, int64_t subset_size) {
  check_features("kid", "a", a);
  check_features("kid", "b", b);
  TORCH_CHECK_VALUE(a.size(1) == b.size(1), "moh::kid: b must have a's ", a.size(1), " columns, got ", b.size(1));
  TORCH_CHECK_VALUE(subsets >= 1 && subset_size >= 2, "moh::kid: subsets must be >= 1 and subset_size >= 2, got ",
                    subsets, " and ", subset_size);
  TORCH_CHECK_VALUE(a.size(0) >= 2 && b.size(0) >= 2, "moh::kid: each set needs at least 2 rows");
  const eval::KIDResult r = eval::kernel_inception_distance(a.cpu(), b.cpu(), subsets, subset_size);
  return {r.mean, r.std};
}

}  // namespace

}  // namespace moh::torch_ops

// fid_report has no tensor argument: CompositeImplicitAutograd is the one key it can dispatch to. The others take
// tensors and read them on the host: CompositeExplicitAutograd, so that FakeTensor and torch.compile never run them on
// fake tensors (gaussian_stats has a fake implementation, moh_torch/_ops.py; the float-valued ones are not traced:
// compile runs them eagerly, as a graph break). None is differentiable.
TORCH_LIBRARY_IMPL(moh, CompositeImplicitAutograd, m) {
  m.impl("fid_report", &moh::torch_ops::fid_report);
}

TORCH_LIBRARY_IMPL(moh, CompositeExplicitAutograd, m) {
  m.impl("fid_report_images", &moh::torch_ops::fid_report_images);
  m.impl("frechet_distance", &moh::torch_ops::frechet_distance);
  m.impl("gaussian_stats", &moh::torch_ops::gaussian_stats);
  m.impl("inception_score", &moh::torch_ops::inception_score);
  m.impl("precision_recall", &moh::torch_ops::precision_recall);
  m.impl("kid", &moh::torch_ops::kid);
}
