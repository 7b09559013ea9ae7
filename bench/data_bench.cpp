#include "bench/data_bench.h"

#include "bench/common.h"

#include "core/error.h"

#ifdef MOH_WITH_OPENCV
#include <ATen/Parallel.h>
#include <cxxopts.hpp>
#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <random>
#include <thread>

#include <unistd.h>

#include "core/io/atomic_io.h"
#include "core/platform/run_context.h"
#include "datasets/image_folder.h"
#include "datasets/stream_loader.h"

namespace moh::bench {

namespace fs = std::filesystem;

namespace {

// An ImageNet-like training image: ImageNet's common sizes (most are 500 px on the long side, 333-375 px on the
// short one, some square or portrait) and content with structure at every scale, so that a JPEG of quality 90 has
// about ImageNet's average file size (~110 KB) and decodes at the same cost.
cv::Mat imagenet_like(std::mt19937_64& rng) {
  static const int sizes[][2] = {{500, 375}, {500, 333}, {375, 500}, {500, 500}, {500, 400}, {333, 500}, {640, 480}};
  const auto& s = sizes[rng() % (sizeof sizes / sizeof sizes[0])];
  const int W = s[0], H = s[1];
  std::normal_distribution<float> n01(0.f, 1.f);
  auto field = [&](int cells, float amp) {  // smooth noise at one scale, (H, W, 3) float
    cv::Mat low(cells, cells, CV_32FC3);
    for (int y = 0; y < cells; ++y)
      for (int x = 0; x < cells; ++x) low.at<cv::Vec3f>(y, x) = cv::Vec3f(n01(rng), n01(rng), n01(rng)) * amp;
    cv::Mat up;
    cv::resize(low, up, cv::Size(W, H), 0, 0, cv::INTER_CUBIC);
    return up;
  };
  cv::Mat img = field(4, 50.f) + field(16, 25.f) + field(64, 15.f) + field(200, 12.f);
  cv::Mat grain(H, W, CV_32FC3);
  cv::randn(grain, cv::Scalar::all(0), cv::Scalar::all(12));  // sensor noise: the entropy of real photos
  img += grain + cv::Scalar(118, 112, 103);
  cv::Mat out;
  img.convertTo(out, CV_8UC3);
  return out;
}

struct Tree {
  std::string root;
  double mean_kb = 0, mean_px = 0;
};

Tree generate_tree(const std::string& root, int64_t images) {
  std::mt19937_64 rng(2024);
  cv::theRNG().state = 2024;  // the grain: the same tree every time
  Tree t{root};
  constexpr int kClasses = 8;
  for (int64_t i = 0; i < images; ++i) {
    const std::string dir = root + "/train/n" + std::to_string(1000 + i % kClasses);
    fs::create_directories(dir);
    const cv::Mat img = imagenet_like(rng);
    char name[32];
    std::snprintf(name, sizeof name, "/%06lld.JPEG", static_cast<long long>(i));
    if (!cv::imwrite(dir + name, img, {cv::IMWRITE_JPEG_QUALITY, 90}))
      throw std::runtime_error("cannot write " + dir + name);
    t.mean_kb += static_cast<double>(fs::file_size(dir + name)) / 1024.0 / static_cast<double>(images);
    t.mean_px += static_cast<double>(img.cols) * img.rows / static_cast<double>(images);
  }
  return t;
}

// Images/s of one whole epoch of `images` through our StreamLoader with `workers` threads (starting the threads
// included: microseconds).
double ours(const datasets::ImageFolderIndex& index, bool train, int workers, int64_t images, int64_t batch) {
  datasets::SampleTransformOptions tf;
  if (train) {
    tf.rand_augment = datasets::RandAugmentSpec::parse("rand-m9-mstd0.5-inc1", "bench");
    tf.erase_prob = 0.25;
  }
  datasets::StreamOptions o;
  o.batch_size = batch;
  o.train = train;
  o.seed = 1;
  o.workers = workers;
  o.prefetch = workers;
  o.root = "bench";
  datasets::ImageFolderIndex first = index;  // the bench's first `images` files
  first.files.resize(std::min(first.files.size(), static_cast<size_t>(images)));
  first.labels.resize(first.files.size());
  const auto start = std::chrono::steady_clock::now();
  datasets::StreamLoader loader(first, tf, o);
  at::Tensor x, y;
  int64_t n = 0;
  while (loader.next(x, y)) n += x.size(0);
  return static_cast<double>(n) / std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The same through bench/torchvision_data.py in `python` (workers 0 = in the main process).
double torchvision(const std::string& python, const std::string& script, const std::string& root, bool train,
                   int workers, int64_t images, int64_t batch) {
  const std::string cmd = python + " " + script + " --root " + root + " --mode " + (train ? "train" : "eval") +
                          " --workers " + std::to_string(workers) + " --images " + std::to_string(images) +
                          " --batch " + std::to_string(batch);
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("cannot run " + cmd);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int rc = ::pclose(p);
  if (rc != 0) throw std::runtime_error("`" + cmd + "` failed (exit " + std::to_string(rc) + ")");
  return nlohmann::json::parse(out.substr(out.rfind('{'))).at("img_per_s").get<double>();
}

}  // namespace

int data_bench_main(int argc, char** argv) {
  cxxopts::Options opts(argv[0], "Input pipeline throughput (JPEG decode + ImageNet train / eval transforms)");
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto flag = opts.add_options();
  flag("root", "ImageFolder tree with a train/ split (default: generate an ImageNet-like one)",
       cxxopts::value<std::string>()->default_value(""));
  flag("images", "images per measurement", cxxopts::value<int64_t>()->default_value("512"));
  flag("workers", "loader threads of the all-cores rows", cxxopts::value<int>()->default_value(std::to_string(cores)));
  flag("batch", "batch size", cxxopts::value<int64_t>()->default_value("32"));
  flag("rounds", "interleaved rounds", cxxopts::value<int>()->default_value("2"));
  flag("python", "also run bench/torchvision_data.py with this Python (e.g. .venv/bin/python) between our rows",
       cxxopts::value<std::string>()->default_value(""));
  flag("script", "path of torchvision_data.py",
       cxxopts::value<std::string>()->default_value("bench/torchvision_data.py"));
  flag("keep", "write the generated tree here and keep it", cxxopts::value<std::string>()->default_value(""));
  flag("json", "print one JSON object");
  flag("h,help", "show this help");
  cxxopts::ParseResult args;
  if (!parse_bench_flags(opts, argc, argv, args)) return 0;
  const int64_t images = args["images"].as<int64_t>(), batch = args["batch"].as<int64_t>();
  const int workers = args["workers"].as<int>(), rounds = args["rounds"].as<int>();
  if (images < 2 * batch || batch < 1) throw UserError("--images", "needs at least two batches", "");
  if (workers < 1 || rounds < 1) throw UserError("--workers / --rounds", "must be positive", "");
  const std::string python = args["python"].as<std::string>(), script = args["script"].as<std::string>();
  if (!python.empty() && !fs::exists(script))
    throw UserError("--script " + script, "not found", "run from the repository root or pass --script");
  if (python.find('/') != std::string::npos && ::access(python.c_str(), X_OK) != 0)
    throw UserError("--python " + python, "not an executable", "MOH_LIBTORCH=pip scripts/setup.sh creates .venv");

  Tree tree;
  std::string scratch;
  if (!args["root"].as<std::string>().empty()) {
    tree.root = args["root"].as<std::string>();
  } else {
    std::string dir = args["keep"].as<std::string>();
    if (dir.empty()) {
      char tmpl[] = "/tmp/moh-bench-data-XXXXXX";
      if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
      dir = scratch = tmpl;
    } else {
      check_output_dir(dir, "--keep " + dir);
    }
    std::cerr << "generating " << images << " ImageNet-like JPEGs in " << dir << "\n";
    tree = generate_tree(dir, images);
  }
  const datasets::ImageFolderIndex index = datasets::scan_image_folder(tree.root, "train");

  at::set_num_threads(1);  // each loader thread is one core; parallelism comes from the threads
  cv::setNumThreads(1);
  nlohmann::json out{{"what", "data"},
                     {"machine", machine_record()},
                     {"images", images},
                     {"batch", batch},
                     {"root", scratch.empty() ? tree.root : "generated (removed)"}};
  if (tree.mean_kb > 0) {
    out["mean_jpeg_kb"] = tree.mean_kb;
    out["mean_megapixels"] = tree.mean_px / 1e6;
  }
  nlohmann::json rows = nlohmann::json::array();
  for (const bool train : {true, false})
    for (const int w : {1, workers}) {
      nlohmann::json row{{"pipeline", train ? "train" : "eval"}, {"cores", w}};
      double sum_ours = 0, sum_tv = 0;
      for (int r = 0; r < rounds; ++r) {
        const double a = ours(index, train, w, images, batch);
        row["ours_img_per_s"].push_back(a);
        sum_ours += a;
        if (!python.empty()) {
          const double b = torchvision(python, script, tree.root, train, w == 1 ? 0 : w, images, batch);
          row["torchvision_img_per_s"].push_back(b);
          sum_tv += b;
        }
      }
      row["ours_per_core"] = sum_ours / rounds / w;
      if (!python.empty()) row["ratio"] = sum_ours / sum_tv;
      if (!args.count("json")) {
        std::printf("%-5s %2d core%s  ours %7.1f img/s", train ? "train" : "eval", w, w > 1 ? "s" : " ",
                    sum_ours / rounds);
        if (!python.empty()) std::printf("  torchvision %7.1f img/s  ratio %.2f", sum_tv / rounds, sum_ours / sum_tv);
        std::printf("\n");
      }
      rows.push_back(row);
      if (w == workers) break;  // one core only: a single row
    }
  out["rows"] = rows;
  if (args.count("json")) std::cout << out.dump() << std::endl;
  if (!scratch.empty()) fs::remove_all(scratch);
  return 0;
}

}  // namespace moh::bench
#else   // MOH_WITH_OPENCV

namespace moh::bench {

int data_bench_main(int, char**) {
  throw UserError("moh bench data", "decoding JPEGs needs OpenCV, which this build was configured without",
                  "rebuild with -DMOH_WITH_OPENCV=ON");
}

}  // namespace moh::bench
#endif  // MOH_WITH_OPENCV
