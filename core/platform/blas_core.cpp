#include "core/platform/blas_core.h"

#include <ATen/ATen.h>

#include <dlfcn.h>
#include <unistd.h>

#include <cctype>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <vector>

#include "core/platform/run_context.h"

extern char** environ;

namespace moh {

int openblas_core_level(const std::string& core) {
  std::string key = core;  // OpenBLAS's own spelling varies in case ("Sandybridge")
  for (char& ch : key) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  static const std::map<std::string, int> level{
      {"katmai", 1},      {"coppermine", 1},   {"northwood", 1},  {"prescott", 1},   {"banias", 1},
      {"atom", 1},        {"core2", 1},        {"penryn", 1},     {"dunnington", 1}, {"nehalem", 1},
      {"opteron", 1},     {"opteron_sse3", 1}, {"barcelona", 1},  {"nano", 1},       {"bobcat", 1},
      {"sandybridge", 2}, {"bulldozer", 2},    {"piledriver", 2}, {"haswell", 3},    {"zen", 3},
      {"steamroller", 3}, {"excavator", 3},    {"skylakex", 4},   {"cooperlake", 5}, {"sapphirerapids", 5}};
  auto it = level.find(key);
  return it == level.end() ? -1 : it->second;
}

std::string best_openblas_core(const std::set<std::string>& f) {
  auto has = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (!f.count(n)) return false;
    return true;
  };
  if (has({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}))
    return has({"avx512_bf16"}) ? "Cooperlake" : "SkylakeX";
  if (has({"avx2", "fma"})) return "Haswell";
  if (has({"avx"})) return "SandyBridge";
  return "";
}

std::string openblas_core_upgrade(const std::string& detected, const std::set<std::string>& cpu_flags) {
  const std::string best = best_openblas_core(cpu_flags);
  const int have = openblas_core_level(detected);
  return have > 0 && !best.empty() && openblas_core_level(best) > have ? best : "";
}

std::set<std::string> cpu_flags() {
  std::ifstream info("/proc/cpuinfo");
  std::set<std::string> out;
  for (std::string line; std::getline(info, line);) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    for (std::string w; words >> w;) out.insert(w);
    break;
  }
  return out;
}

namespace {

// openblas_get_corename() of the OpenBLAS mapped into this process ("" when there is none).
std::string openblas_corename() {
  if (detect_blas().name != "OpenBLAS") return "";
  using Fn = char* (*)();
  auto fn = reinterpret_cast<Fn>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  const char* name = fn ? fn() : nullptr;
  if (!name) return "";
  return name;
}

bool same_core(std::string a, std::string b) {  // OpenBLAS spells some names in other cases ("Sandybridge")
  for (auto* s : {&a, &b})
    for (char& ch : *s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return a == b;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// max |got − want| / max |want| of an (m, n) product against a plain loop in double.
double product_error(const at::Tensor& a, const at::Tensor& b, const at::Tensor& got) {
  const at::Tensor A = a.to(at::kDouble).contiguous(), B = b.to(at::kDouble).contiguous();
  const at::Tensor C = got.to(at::kDouble).contiguous();
  const int64_t m = A.size(0), k = A.size(1), n = B.size(1);
  const double *pa = A.data_ptr<double>(), *pb = B.data_ptr<double>(), *pc = C.data_ptr<double>();
  double worst = 0, scale = 1e-300;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l) s += pa[i * k + l] * pb[l * n + j];
      worst = std::max(worst, std::abs(pc[i * n + j] - s));
      scale = std::max(scale, std::abs(s));
    }
  return worst / scale;
}

}  // namespace

std::string check_blas_products() {
  at::Generator g = at::detail::createCPUGenerator(1234);
  struct Case {
    int64_t m, k, n;
    bool ta, tb;
  };
  // Odd sizes reach the kernels' edge paths; the larger ones the packed, multi-threaded paths; transposed operands
  // the other GEMM layouts; n = 1 the matrix-vector kernels.
  const std::vector<Case> cases{{64, 64, 64, false, false}, {67, 131, 45, false, false},  {67, 131, 45, true, false},
                                {67, 131, 45, false, true}, {160, 384, 96, false, false}, {300, 200, 1, false, false},
                                {1, 200, 300, false, false}};
  const std::string inject = env("MOH_BLAS_SELFCHECK_INJECT");
  if (inject == "crash") std::raise(SIGILL);
  for (at::ScalarType dt : {at::kFloat, at::kDouble}) {
    const double tol = dt == at::kFloat ? 1e-4 : 1e-11;
    for (const Case& c : cases) {
      at::Tensor a = at::randn({c.ta ? c.k : c.m, c.ta ? c.m : c.k}, g).to(dt);
      at::Tensor b = at::randn({c.tb ? c.n : c.k, c.tb ? c.k : c.n}, g).to(dt);
      if (c.ta) a = a.t();
      if (c.tb) b = b.t();
      at::Tensor got = at::mm(a, b);
      if (inject == "wrong") got = got + 1e-2 * got.abs().max();
      const double e = product_error(a, b, got);
      if (!(e <= tol)) {
        std::ostringstream why;
        why << (dt == at::kFloat ? "fp32" : "fp64") << " product " << c.m << "x" << c.k << " @ " << c.k << "x" << c.n
            << (c.ta ? " (A transposed)" : "") << (c.tb ? " (B transposed)" : "") << " off by " << e << " (relative)";
        return why.str();
      }
    }
  }
  return "";
}

BlasCore blas_core() {
  BlasCore c;
  c.used = openblas_corename();
  if (c.used.empty()) return c;
  const std::string from = env("MOH_BLAS_CORE_FROM"), failed = env("MOH_BLAS_CORE_FAILED");
  if (!failed.empty()) {
    c.detected = from;
    c.how = "self-check of " + env("MOH_BLAS_CORE_TRIED") + " failed (" + failed + "): OpenBLAS's choice kept";
  } else if (!from.empty()) {
    c.detected = from;
    c.how = "chosen by moh for this CPU, self-check passed" +
            std::string(std::getenv("MOH_BLAS_ASSUME_CORE") ? " (MOH_BLAS_ASSUME_CORE)" : "");
  } else if (!env("OPENBLAS_CORETYPE").empty()) {
    c.detected = "?";
    c.how = "OPENBLAS_CORETYPE=" + env("OPENBLAS_CORETYPE") + " (yours)";
  } else {
    c.detected = c.used;
    c.how = "OpenBLAS's own choice";
  }
  return c;
}

namespace {

// The process again with `argv` and the environment `envp`; returns only if exec fails.
std::vector<std::string> g_args;
std::vector<char*> g_argv, g_fallback_envp;
std::vector<std::string> g_fallback_env;

// The environment of this process with `set` applied (NAME=VALUE entries replace or add).
std::vector<std::string> environment_with(const std::map<std::string, std::string>& set) {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry(*e);
    if (!set.count(entry.substr(0, entry.find('=')))) out.push_back(entry);
  }
  for (const auto& [k, v] : set) out.push_back(k + "=" + v);
  return out;
}

extern "C" void on_bad_kernel(int) {
  ::execve("/proc/self/exe", g_argv.data(), g_fallback_envp.data());  // async-signal-safe
  ::_exit(70);
}

// In the process re-executed with a new core: its self-check, run with a way back for a crash.
void check_chosen_core() {
  const std::string tried = env("OPENBLAS_CORETYPE"), from = env("MOH_BLAS_CORE_FROM");
  auto fallback_env = [&](const std::string& why) {
    return environment_with({{"OPENBLAS_CORETYPE", from},
                             {"MOH_BLAS_CORE_TRIED", tried},
                             {"MOH_BLAS_CORE_FAILED", why},
                             {"MOH_BLAS_CORE_CHECKED", "1"}});
  };
  g_fallback_env = fallback_env("illegal instruction or memory fault");
  g_fallback_envp.clear();
  for (auto& e : g_fallback_env) g_fallback_envp.push_back(e.data());
  g_fallback_envp.push_back(nullptr);
  struct sigaction on {
  }, old_ill{}, old_segv{}, old_bus{};
  on.sa_handler = on_bad_kernel;
  ::sigaction(SIGILL, &on, &old_ill), ::sigaction(SIGSEGV, &on, &old_segv), ::sigaction(SIGBUS, &on, &old_bus);
  std::string why = same_core(openblas_corename(), tried) ? check_blas_products() : "OpenBLAS did not take it";
  ::sigaction(SIGILL, &old_ill, nullptr), ::sigaction(SIGSEGV, &old_segv, nullptr),
      ::sigaction(SIGBUS, &old_bus, nullptr);
  if (why.empty()) {
    ::setenv("MOH_BLAS_CORE_CHECKED", "1", 1);  // processes started from here (moh launch) need not check again
    return;
  }
  g_fallback_env = fallback_env(why);
  g_fallback_envp.clear();
  for (auto& e : g_fallback_env) g_fallback_envp.push_back(e.data());
  g_fallback_envp.push_back(nullptr);
  ::execve("/proc/self/exe", g_argv.data(), g_fallback_envp.data());
}

}  // namespace

void prepare_cpu_setup(char** argv) {
  g_argv.clear();
  for (char** a = argv; a && *a; ++a) g_argv.push_back(*a);
  g_argv.push_back(nullptr);
  if (!env("MOH_BLAS_CORE_FROM").empty() && env("MOH_BLAS_CORE_CHECKED").empty()) check_chosen_core();
  // Once per run: a launcher's ranks each check the core it chose for them, the first of each machine says it.
  const bool speaks = env("LOCAL_RANK").empty() || env("LOCAL_RANK") == "0";
  if (!env("MOH_BLAS_CORE_FAILED").empty() && env("MOH_BLAS_CORE_WARNED").empty() && speaks) {
    std::cerr << "warning: OpenBLAS core " << env("MOH_BLAS_CORE_TRIED") << " failed moh's self-check ("
              << env("MOH_BLAS_CORE_FAILED") << "): running on OpenBLAS's own choice " << env("MOH_BLAS_CORE_FROM")
              << " (set OPENBLAS_CORETYPE to choose one)\n";
    ::setenv("MOH_BLAS_CORE_WARNED", "1", 1);
  }
}

std::map<std::string, std::string> cpu_env_needed() {
  std::map<std::string, std::string> set;
  if (needs_sleeping_openmp()) set["OMP_WAIT_POLICY"] = "passive", set["MOH_THREADS_SET"] = "1";
  if (env("OPENBLAS_CORETYPE").empty() && env("MOH_BLAS_CORE_FROM").empty()) {
    const std::string assumed = env("MOH_BLAS_ASSUME_CORE");
    const std::string detected = assumed.empty() ? openblas_corename() : assumed;
    const std::string better = detected.empty() ? "" : openblas_core_upgrade(detected, cpu_flags());
    if (!better.empty()) set["OPENBLAS_CORETYPE"] = better, set["MOH_BLAS_CORE_FROM"] = detected;
  }
  return set;
}

void reexec_for_cpu() {
  const std::map<std::string, std::string> set = cpu_env_needed();
  if (set.empty() || g_argv.size() < 2) return;  // nothing to change, or prepare_cpu_setup never ran
  for (const auto& [k, v] : set) ::setenv(k.c_str(), v.c_str(), 1);
  ::execv("/proc/self/exe", g_argv.data());  // returns only on failure: go on as we are
  for (const auto& [k, v] : set) ::unsetenv(k.c_str());
}

void reexec_for_cpu(char** argv) {
  prepare_cpu_setup(argv);
  reexec_for_cpu();
}

void set_cpu_env_for_children() {
  for (const auto& [k, v] : cpu_env_needed()) ::setenv(k.c_str(), v.c_str(), 1);
}

void reexec_for_cpu_from_cmdline() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  for (std::string a; std::getline(in, a, '\0');) g_args.push_back(a);
  if (g_args.empty()) return;
  std::vector<char*> argv;
  for (auto& a : g_args) argv.push_back(a.data());
  argv.push_back(nullptr);
  reexec_for_cpu(argv.data());
}

}  // namespace moh
