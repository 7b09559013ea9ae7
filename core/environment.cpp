#include "core/environment.h"

#include <cstdlib>
#include <sstream>

#include "core/error.h"
#include "core/parse.h"

namespace moh {

namespace {

constexpr double kMaxRanks = 65536;         // processes of one job
constexpr double kMaxDistTimeout = 604800;  // a week: beyond, a wait is a hang

EnvSwitch integer(const char* name, double min, double max, const char* meaning, bool internal = false) {
  return {name, EnvKind::integer, min, max, {}, meaning, internal};
}
EnvSwitch word(const char* name, std::vector<std::string> words, const char* meaning, bool internal = false) {
  return {name, EnvKind::word, 0, 0, std::move(words), meaning, internal};
}
EnvSwitch text(const char* name, const char* meaning, bool internal = false) {
  return {name, EnvKind::text, 0, 0, {}, meaning, internal};
}

std::string range_text(const EnvSwitch& s) {
  std::ostringstream o;
  switch (s.kind) {
    case EnvKind::integer:
      o << "an integer in [" << static_cast<int64_t>(s.min) << ", " << static_cast<int64_t>(s.max) << "]";
      break;
    case EnvKind::number:
      o << "a number in [" << s.min << ", " << s.max << "]";
      break;
    case EnvKind::word:
      o << "one of " << join(s.words, ", ");
      break;
    case EnvKind::text:
      o << "non-empty text";
      break;
  }
  return o.str();
}

const EnvSwitch& find(const char* name) {
  for (const EnvSwitch& s : env_switches())
    if (std::string(s.name) == name) return s;
  throw std::logic_error(std::string("environment: ") + name + " is not in the table");
}

// The checked value of one set variable (as a number for integer / number kinds).
void check_one(const EnvSwitch& s, const std::string& v, double* number) {
  const std::string what = std::string("environment ") + s.name;
  const std::string bad = "\"" + v + "\" is not " + range_text(s);
  switch (s.kind) {
    case EnvKind::integer: {
      const std::optional<int64_t> n = parse_int(v);
      if (!n || static_cast<double>(*n) < s.min || static_cast<double>(*n) > s.max)
        throw UserError(what, bad, s.meaning);
      if (number) *number = static_cast<double>(*n);
      return;
    }
    case EnvKind::number: {
      const std::optional<double> n = parse_double(v);
      if (!n || *n < s.min || *n > s.max) throw UserError(what, bad, s.meaning);
      if (number) *number = *n;
      return;
    }
    case EnvKind::word:
      for (const std::string& w : s.words)
        if (v == w) return;
      throw UserError(what, bad, s.meaning);
    case EnvKind::text:
      if (v.empty()) throw UserError(what, "is set but empty", std::string(s.meaning) + "; unset it for the default");
      return;
  }
}

const char* get(const char* name) {
  return std::getenv(name);
}

// RANK < WORLD_SIZE (torchrun / moh launch; SLURM's names where torchrun's are unset), LOCAL_RANK < LOCAL_WORLD_SIZE.
void check_ranks() {
  const auto value = [](const char* a, const char* b, double fallback) {
    const char* v = get(a) ? get(a) : get(b);
    return v ? static_cast<double>(*parse_int(v)) : fallback;  // each one checked already
  };
  const double world = value("WORLD_SIZE", "SLURM_NTASKS", 1), rank = value("RANK", "SLURM_PROCID", 0);
  if (rank >= world)
    throw UserError("environment RANK",
                    std::to_string(static_cast<int64_t>(rank)) + " is not below WORLD_SIZE " +
                        std::to_string(static_cast<int64_t>(world)) +
                        (get("WORLD_SIZE") || get("SLURM_NTASKS") ? "" : " (unset: 1)"),
                    "ranks are 0 .. WORLD_SIZE - 1; launch with torchrun or moh launch");
  const double local_world = value("LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE", 0);
  const double local = value("LOCAL_RANK", "SLURM_LOCALID", 0);
  if (local_world > 0 && local >= local_world)
    throw UserError("environment LOCAL_RANK",
                    std::to_string(static_cast<int64_t>(local)) + " is not below LOCAL_WORLD_SIZE " +
                        std::to_string(static_cast<int64_t>(local_world)),
                    "launch with torchrun or moh launch");
}

}  // namespace

const std::vector<EnvSwitch>& env_switches() {
  static const std::vector<EnvSwitch> table = {
      integer("RANK", 0, kMaxRanks - 1, "this process's rank (torchrun, moh launch)"),
      integer("WORLD_SIZE", 1, kMaxRanks, "processes of the job (torchrun, moh launch)"),
      integer("LOCAL_RANK", 0, kMaxRanks - 1, "this process's rank on its machine (picks its GPU)"),
      integer("LOCAL_WORLD_SIZE", 1, kMaxRanks, "processes on this machine"),
      integer("SLURM_PROCID", 0, kMaxRanks - 1, "RANK under srun, where RANK is unset"),
      integer("SLURM_NTASKS", 1, kMaxRanks, "WORLD_SIZE under srun, where WORLD_SIZE is unset"),
      integer("SLURM_LOCALID", 0, kMaxRanks - 1, "LOCAL_RANK under srun, where LOCAL_RANK is unset"),
      integer("TORCHELASTIC_RESTART_COUNT", 0, 1e6, "restarts so far (torchrun --max-restarts)"),
      integer("TORCHELASTIC_MAX_RESTARTS", 0, 1e6, "restarts allowed (torchrun --max-restarts)"),
      text("MASTER_ADDR", "the rendezvous host (default 127.0.0.1)"),
      integer("MASTER_PORT", 1, 65535, "the rendezvous TCP port (default 29500)"),
      {"MOH_DIST_TIMEOUT",
       EnvKind::number,
       1,
       kMaxDistTimeout,
       {},
       "seconds a rank waits for the others (rendezvous, collectives) before it gives up (default 300)"},
      word("MOH_MEMORY_CHECK", {"0", "1", "verbose"},
           "the memory check before training, sampling and FID: 1 (default) checks, 0 skips it, verbose also "
           "prints its measurements"),
      text("MOH_CPU_PRECISION_CACHE", "the file that keeps precision: auto's verdict per CPU and build"),
      text("MOH_RESUME_PREFIX", "the command a stopped run's resume hint starts with (default: this program)"),
      text("MOH_RANK_ERROR_FILE", "where a rank of `moh launch` leaves an input error met before the ranks met", true),
      text("MOH_BLAS_ASSUME_CORE", "an OpenBLAS core name to assume for this CPU when OpenBLAS detects an older one"),
      text("MOH_BLAS_CORE_FROM", "the OpenBLAS core detected before moh chose another", true),
      text("MOH_BLAS_CORE_TRIED", "the OpenBLAS core moh chose", true),
      text("MOH_BLAS_CORE_FAILED", "why the chosen OpenBLAS core failed its self-check", true),
      word("MOH_BLAS_CORE_CHECKED", {"1"}, "the chosen OpenBLAS core passed its self-check", true),
      word("MOH_BLAS_CORE_WARNED", {"1"}, "the self-check's warning was printed", true),
      text("MOH_BLAS_SELFCHECK_INJECT", "tests only: makes the self-check of a core fail", true),
      word("MOH_THREADS_SET", {"1"}, "moh set OMP_WAIT_POLICY for its processes", true),
      word("MOH_LIBSTDCXX_PRELOADED", {"1"}, "moh started itself again with the system's libstdc++ preloaded", true),
  };
  return table;
}

void check_environment() {
  for (const EnvSwitch& s : env_switches())
    if (const char* v = get(s.name)) check_one(s, v, nullptr);
  check_ranks();
}

std::optional<double> env_number(const char* name) {
  const EnvSwitch& s = find(name);
  const char* v = get(name);
  if (!v) return std::nullopt;
  double n = 0;
  check_one(s, v, &n);
  return n;
}

std::optional<std::string> env_word(const char* name) {
  const EnvSwitch& s = find(name);
  const char* v = get(name);
  if (!v) return std::nullopt;
  check_one(s, v, nullptr);
  return std::string(v);
}

std::string environment_markdown() {
  std::ostringstream o;
  o << "| variable | takes | what it does |\n|---|---|---|\n";
  for (const EnvSwitch& s : env_switches())
    o << "| `" << s.name << "` | " << range_text(s) << " | "
      << (s.internal ? "(set by moh for its own processes) " : "") << s.meaning << " |\n";
  return o.str();
}

}  // namespace moh
