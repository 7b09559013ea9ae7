#include "core/dist/launcher.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/platform/blas_core.h"

namespace moh {

namespace {

// A TCP port that was free a moment ago (bind to port 0, read it back).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 29500;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = 29500;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

}  // namespace

// Whether rank 0 can open its store on `port` here: it listens on every address with SO_REUSEADDR (as TCPStore
// does), so a port that a finished run left in TIME_WAIT counts as free and one another program listens on does not.
bool port_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return true;  // let the store say what is wrong
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 || errno != EADDRINUSE;
  ::close(fd);
  return ok;
}

namespace {

// Signals that reached the launcher (each is forwarded to every rank once).
volatile std::sig_atomic_t g_signals = 0, g_last_signal = 0;
struct sigaction g_old_int {
}, g_old_term{};  // the launcher's own handlers, which its ranks get back
extern "C" void on_launcher_signal(int sig) {
  g_last_signal = sig;
  g_signals = g_signals + 1;
}

bool is_stop_code(int code) {
  return code == 128 + SIGINT || code == 128 + SIGTERM;
}

// SIGKILL that nobody here sent is most often the kernel's out-of-memory killer (every rank holds its own model,
// optimizer and batch: a job that fits one process can exceed the machine's memory with several).
std::string killed_hint(int sig) {
  return sig == SIGKILL ? " (SIGKILL: most likely out of memory; `dmesg` tells; lower data.batch_size or "
                          "train.processes)"
                        : "";
}

}  // namespace

int rank_threads(int nproc) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<int>(std::max(1u, cores / static_cast<unsigned>(std::max(1, nproc))));
}

namespace {

// The ranks of this machine, started as children (see launch_local).
struct Ranks {
  std::vector<pid_t> pids;
  int n = 0;
  NodePlace place;
  std::string error_dir;  ///< where local ranks other than 0 leave an input error met before the ranks met
};

// The file local rank r (> 0) leaves its early input error in: every rank reads the same input, so such an error is
// usually everyone's and rank 0 says it once; the launcher prints this file's line only when rank 0 does not.
std::string rank_error_file(const Ranks& ranks, int r) {
  return ranks.error_dir + "/rank_" + std::to_string(r) + ".err";
}

// Sets the torchrun variables of local rank r and becomes the command (in the child after fork).
[[noreturn]] void exec_rank(int r, const Ranks& ranks, int port, std::vector<std::string> child_args,
                            const std::string& resume_prefix, const std::string& threads, int restart,
                            int max_restarts) {
  const NodePlace& place = ranks.place;
  if (resume_prefix.empty())
    ::unsetenv("MOH_RESUME_PREFIX");
  else
    ::setenv("MOH_RESUME_PREFIX", resume_prefix.c_str(), 1);
  ::setenv("RANK", std::to_string(place.node_rank * ranks.n + r).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
  if (r > 0 && !ranks.error_dir.empty())
    ::setenv("MOH_RANK_ERROR_FILE", rank_error_file(ranks, r).c_str(), 1);
  else
    ::unsetenv("MOH_RANK_ERROR_FILE");
  ::setenv("WORLD_SIZE", std::to_string(place.nnodes * ranks.n).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(ranks.n).c_str(), 1);
  ::setenv("GROUP_RANK", std::to_string(place.node_rank).c_str(), 1);
  ::setenv("MASTER_ADDR", place.master_addr.c_str(), 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  ::setenv("TORCHELASTIC_RESTART_COUNT", std::to_string(restart).c_str(), 1);
  ::setenv("TORCHELASTIC_MAX_RESTARTS", std::to_string(max_restarts).c_str(), 1);
  ::setenv("OMP_NUM_THREADS", threads.c_str(), 0);  // keep the user's choice
  ::setenv("GLOG_minloglevel", "3", 0);             // c10d's own log lines: our errors say what failed, in one line
  std::vector<char*> cargv;
  for (auto& a : child_args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  ::execv("/proc/self/exe", cargv.data());
  std::cerr << "error: rank " << place.node_rank * ranks.n + r
            << ": cannot start /proc/self/exe: " << std::strerror(errno) << "\n";
  ::_exit(kExitRuntime);
}

Ranks start_ranks(int n, int port, const std::vector<std::string>& child_args, const std::string& resume_prefix,
                  const NodePlace& place, int restart, int max_restarts) {
  const std::string threads = std::to_string(rank_threads(n));
  const pid_t launcher = ::getpid();
  Ranks ranks{{}, n, place, {}};
  std::string dir = (std::filesystem::temp_directory_path() / "moh_launch_XXXXXX").string();
  if (n > 1 && ::mkdtemp(dir.data())) ranks.error_dir = dir;  // without it every rank says its own errors
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed: " + std::string(std::strerror(errno)));
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);                  // a launcher killed with -9 takes its ranks along
      if (::getppid() != launcher) ::_exit(kExitRuntime);  // it died before prctl took effect
      ::setpgid(0, 0);
      ::sigaction(SIGINT, &g_old_int, nullptr), ::sigaction(SIGTERM, &g_old_term, nullptr);
      exec_rank(r, ranks, port, child_args, resume_prefix, threads, restart, max_restarts);
    }
    ::setpgid(pid, pid);  // also here: no signal may reach a rank through the terminal before the child's own call
    ranks.pids.push_back(pid);
  }
  return ranks;
}

// How the ranks of one start ended: the exit code (0, or the first failing rank's), and whether they were stopped by
// a signal the launcher forwarded (Ctrl-C: no restart).
struct Outcome {
  int code = kExitOk;
  bool on_request = false;
  std::string how = "exit 0";  ///< the first failing rank's end, for the restart line: "exit N" or "signal N"
};

// A rank stopped by a signal (SIGSTOP, a debugger) stays alive and silent while the others wait for it in their next
// collective: say so at once, and again when it continues.
void report_pause(int rank, pid_t pid, int status) {
  if (WIFCONTINUED(status)) {
    std::cerr << "moh launch: rank " << rank << " (pid " << pid << ") continues\n";
    return;
  }
  std::cerr << "moh launch: rank " << rank << " (pid " << pid << ") was stopped by signal " << WSTOPSIG(status) << " ("
            << strsignal(WSTOPSIG(status)) << "); the other ranks wait for it until MOH_DIST_TIMEOUT ("
            << "kill -CONT " << pid << " resumes it)\n";
}

// Prints the input error local rank r left in its file (rank 0 said none).
void say_rank_error(const Ranks& ranks, int r) {
  std::ifstream in(rank_error_file(ranks, r));
  std::string line;
  if (std::getline(in, line) && !line.empty()) std::cerr << line << "\n";
}

// Waits; the first failure stops the rest: SIGTERM, then SIGKILL 10 s later. An input error (exit 2) of a rank other
// than 0 first gives rank 0 up to 30 s to fail alike and print the one error line (the other ranks stay quiet).
Outcome wait_ranks(Ranks& ranks) {
  using Clock = std::chrono::steady_clock;
  Outcome out;
  int alive = ranks.n, forwarded = 0, quiet_error_rank = -1;
  bool stopping = false, termed = false, rank0_said = false;
  auto term_at = Clock::time_point::max(), kill_at = Clock::time_point::max();
  auto signal_all = [&](int sig) {
    for (pid_t p : ranks.pids)
      if (p > 0) ::kill(p, sig);
  };
  while (alive > 0) {
    for (; forwarded < g_signals; ++forwarded) signal_all(g_last_signal);
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, (stopping ? WNOHANG : 0) | WUNTRACED | WCONTINUED);
    if (pid < 0 && errno == EINTR) continue;
    if (pid == 0) {  // stopping, nobody exited yet
      const auto now = Clock::now();
      if (!termed && now >= term_at) signal_all(SIGTERM), signal_all(SIGCONT), termed = true;  // a stopped rank too
      if (now >= kill_at) signal_all(SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    if (pid < 0) break;
    const auto it = std::find(ranks.pids.begin(), ranks.pids.end(), pid);
    if (it == ranks.pids.end()) continue;
    const int rank = static_cast<int>(it - ranks.pids.begin());
    if (WIFSTOPPED(status) || WIFCONTINUED(status)) {
      report_pause(ranks.place.node_rank * ranks.n + rank, pid, status);
      continue;
    }
    *it = -1;
    --alive;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : kExitRuntime;
    if (forwarded > 0 && is_stop_code(code)) {  // a rank stopped on the forwarded signal; the others are stopping too
      if (out.code == kExitOk) out.code = code;
      out.on_request = true;
      continue;
    }
    if (code != kExitOk && !stopping) {
      if (WIFSIGNALED(status))
        std::cerr << "error: rank " << ranks.place.node_rank * ranks.n + rank << " was killed by signal "
                  << WTERMSIG(status) << killed_hint(WTERMSIG(status)) << "\n";
      out.code = code;
      out.how = WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status)) : "exit " + std::to_string(code);
      stopping = true;
      const bool wait_for_rank0 = code == kExitUserError && rank != 0 && ranks.pids[0] > 0;
      if (code == kExitUserError && rank != 0) quiet_error_rank = rank;
      term_at = Clock::now() + std::chrono::seconds(wait_for_rank0 ? 30 : 0);
      kill_at = term_at + std::chrono::seconds(10);
    } else if (stopping && rank == 0 && code == kExitUserError) {
      out.code = code;  // rank 0 said what was wrong; stop the rest now
      rank0_said = true;
      term_at = std::min(term_at, Clock::now());
      kill_at = std::min(kill_at, term_at + std::chrono::seconds(10));
    }
  }
  out.on_request = out.on_request || forwarded > 0;
  if (quiet_error_rank > 0 && !rank0_said) say_rank_error(ranks, quiet_error_rank);
  if (!ranks.error_dir.empty()) std::filesystem::remove_all(ranks.error_dir);
  return out;
}

// The command of a restart: a training run goes on from its latest checkpoint (`--resume auto` in place of any
// --resume); sampling continues from its parts by itself, evaluation starts again.
std::vector<std::string> restart_args(std::vector<std::string> args) {
  if (args.empty() || args[0] != "train") return args;
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--resume") {
      ++i;
      continue;
    }
    if (args[i].rfind("--resume=", 0) != 0) out.push_back(args[i]);
  }
  out.emplace_back("--resume");
  out.emplace_back("auto");
  return out;
}

}  // namespace

int launch_local(const LaunchPlan& plan) {
  const int n = plan.nproc, max_restarts = plan.max_restarts;
  const int port = plan.port == 0 ? free_port() : plan.port;
  std::vector<std::string> command = plan.args;
  set_cpu_env_for_children();  // the ranks compute, the launcher does not: they start with it
                               // (core/platform/blas_core.h)
  // Ctrl-C reaches the launcher alone (the ranks get their own process group) and is forwarded once per press.
  struct sigaction sa {};
  sa.sa_handler = on_launcher_signal;
  sigemptyset(&sa.sa_mask);  // no SA_RESTART: waitpid returns EINTR and the loop forwards the signal
  g_signals = 0;
  ::sigaction(SIGINT, &sa, &g_old_int);
  ::sigaction(SIGTERM, &sa, &g_old_term);
  Outcome out;
  for (int restart = 0;; ++restart) {
    std::vector<std::string> child_args{plan.program};
    child_args.insert(child_args.end(), command.begin(), command.end());
    Ranks ranks = start_ranks(n, port, child_args, plan.resume_prefix, plan.place, restart, max_restarts);
    out = wait_ranks(ranks);
    if (out.code == kExitOk || out.code == kExitUserError || out.on_request || restart >= max_restarts) break;
    std::cerr << "moh launch: a rank failed (" << out.how << "): stopping this machine's ranks and starting them "
              << "again, restart " << restart + 1 << " of at most " << max_restarts << "\n";
    command = restart_args(command);
  }
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
  return out.code;
}

std::string resume_command(const std::string& program, int argc, char** argv, const std::string& run_dir) {
  auto quote = [](const std::string& a) {
    if (!a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") ==
                          std::string::npos)
      return a;
    std::string q = "'";
    for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  const char* prefix = std::getenv("MOH_RESUME_PREFIX");
  std::string cmd = prefix && *prefix ? std::string(prefix) : program;
  cmd += " train";
  bool has_run_dir = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--resume" || a == "--allow-config-change") {
      if (a == "--resume") ++i;  // its value
      continue;
    }
    if (a.rfind("--resume=", 0) == 0) continue;
    has_run_dir = has_run_dir || a == "--run-dir" || a.rfind("--run-dir=", 0) == 0;
    cmd += ' ';
    cmd += quote(a);
  }
  if (!has_run_dir) cmd += " --run-dir " + quote(run_dir);
  return cmd + " --resume auto";
}

}  // namespace moh
