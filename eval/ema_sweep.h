#pragma once
// `moh ema sweep`: EMAs of a range of σ_rel reconstructed from one run's post-hoc EMA snapshots
// (core/train/phema_run.h), each measured by the caller (the FID of its samples, or its top-1), optionally beside the
// run's own raw and fixed-decay EMA weights. Rows, a table and the curve go into one directory, rewritten after every
// point, so that a second start with the same run and measure goes on where the first stopped.
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moh::eval {

/// "a:b:n" (n values from a to b, evenly spaced, both ends included) or a list "a,b,c". A malformed spec, n < 1, or a
/// value outside the power-function profiles' range (0, phema::max_sigma_rel()] is a UserError naming `what`.
std::vector<double> parse_sigma_rels(const std::string& spec, const std::string& what);

/// Which weights a sweep point measures.
enum class SweepWeights { reconstructed, raw, fixed_ema };

/// Measures `checkpoint` (a run or checkpoint directory) with its `weights`, working in the empty directory
/// `work_dir`; returns the measuring command's report (report.json: "metrics" and its provenance).
using SweepMeasure =
    std::function<nlohmann::json(const std::string& checkpoint, SweepWeights weights, const std::string& work_dir)>;

/// What to sweep.
struct EmaSweepRequest {
  std::string run;                      ///< a run directory trained with train.phema
  std::string out;                      ///< new, empty, or a previous sweep of the same run, step and measure
  std::vector<double> sigma_rels;       ///< in the order measured
  int64_t step = 0;                     ///< the EMAs' end step: the last snapshot at or before it (0 = the last)
  std::vector<SweepWeights> baselines;  ///< the run's own weights measured too (raw, fixed_ema), before the σ_rels
  std::string metric;                   ///< the report metric the curve draws ("fid", "top1", ...)
  nlohmann::json measure;               ///< what measures (command and flags): part of the sweep's identity
};

/// Every row measured (new and resumed) and the files written.
struct EmaSweepResult {
  std::vector<nlohmann::json> rows;
  std::string table, json, chart_svg, chart_png;  ///< OUT/sweep.md, OUT/sweep.json, OUT/sweep.svg / .png
  int64_t step = 0;                               ///< the reconstructions' end step
  int64_t resumed = 0;                            ///< rows found in OUT from an earlier start
};

/// Checks the request before any work (snapshots exist, the step has one, every σ_rel is in range, OUT is new or
/// the same sweep), then measures each point not yet in OUT/sweep.json: the reconstruction of σ_rel into
/// OUT/sigma_S/ema (its checkpoint removed after the measurement; phema_reconstruction.json kept), the measure in
/// OUT/sigma_S; baselines in OUT/raw and OUT/fixed_ema. `on_row` is called after each new row.
EmaSweepResult run_ema_sweep(const EmaSweepRequest& request, const SweepMeasure& measure,
                             const std::function<void(const nlohmann::json& row, size_t done, size_t total)>& on_row);

/// The markdown table of a sweep's rows: one row per point (baselines first, then by σ_rel), every metric of the
/// first row's report as a column, and the best reconstructed σ_rel by `metric` (lower is better for fid, sfid, kid
/// and loss, higher otherwise).
std::string sweep_table(const std::vector<nlohmann::json>& rows, const std::string& metric);

}  // namespace moh::eval
