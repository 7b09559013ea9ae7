// `moh launch --nproc N [--master-port P] -- <moh subcommand> ARGS...`: a local torchrun. Starts N copies of this
// binary with RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT set (and OMP_NUM_THREADS = cores / N unless
// given), forwards their output, and when one exits with an error stops the others and returns that exit code.
// On several machines, one launcher per machine: --nnodes M --node_rank R --master_addr HOST0 --master_port P.
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
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/error.h"

namespace moh::apps {

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

// --nnodes / --node_rank / --master_addr, checked.
NodePlace node_place(const cxxopts::ParseResult& args) {
  NodePlace p;
  const std::string nnodes = args["nnodes"].as<std::string>();
  const size_t colon = nnodes.find(':');
  const std::string lo = nnodes.substr(0, colon), hi = colon == std::string::npos ? lo : nnodes.substr(colon + 1);
  if (lo != hi || lo.empty() || lo.find_first_not_of("0123456789") != std::string::npos || lo.size() > 4)
    throw UserError("--nnodes " + nnodes, "must be a number of machines (M, or M:M; elastic ranges are not supported)",
                    "e.g. --nnodes 2");
  p.nnodes = std::stoi(lo);
  p.node_rank = args["node_rank"].as<int>();
  p.master_addr = args["master_addr"].as<std::string>();
  if (p.nnodes < 1) throw UserError("--nnodes " + nnodes, "must be at least 1", "");
  if (p.node_rank < 0 || p.node_rank >= p.nnodes)
    throw UserError("--node_rank " + std::to_string(p.node_rank),
                    "must be in 0 … " + std::to_string(p.nnodes - 1) + " (--nnodes " + nnodes + ")", "");
  if (p.master_addr.empty()) throw UserError("--master_addr", "is empty", "the address of machine 0");
  return p;
}

}  // namespace

int cmd_launch(int argc, char** argv) {
  // Everything after "--" belongs to the child command.
  int split = argc;
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--")) {
      split = i;
      break;
    }
  cxxopts::Options opts(argv[0], "Run a moh subcommand as N data-parallel processes per machine (like torchrun)");
  opts.positional_help("-- train CONFIG.yaml [ARGS...]");
  opts.custom_help("[--nproc N] [--master-port P] [--nnodes M --node_rank R --master_addr HOST] [--max-restarts N]");
  opts.add_options()("nproc,nproc_per_node,nproc-per-node", "number of processes (torchrun: --nproc_per_node)",
                     cxxopts::value<int>()->default_value("2"))(
      "master-port,master_port", "TCPStore port (0 = a free one on one machine, 29500 on several)",
      cxxopts::value<int>()->default_value("0"))("nnodes", "machines taking part, one launcher on each (M or M:M)",
                                                 cxxopts::value<std::string>()->default_value("1"))(
      "node_rank,node-rank", "this machine's index, 0 … M-1 (0 hosts the rendezvous)",
      cxxopts::value<int>()->default_value("0"))("master_addr,master-addr",
                                                 "address of machine 0, reachable from every machine",
                                                 cxxopts::value<std::string>()->default_value("127.0.0.1"))(
      "max-restarts,max_restarts",
      "when a rank fails, stop every rank and start them again, at most N times "
      "(torchrun's meaning; training resumes from its latest checkpoint)",
      cxxopts::value<int>()->default_value("0"))("standalone", "torchrun's single-machine flag (one machine)")(
      "h,help", "show this help");
  auto args = parse_or_throw(opts, split, argv);
  if (args.count("help")) {
    std::cout
        << opts.help() << "\nThe command to run comes after `--`, as with torchrun:\n"
        << "  moh launch --nproc_per_node 2 -- train configs/fashion_mnist/moh_vit_nano.yaml --run-dir runs/nano_ddp\n"
        << "  moh launch --nproc 4 -- sample --ckpt runs/dit --num-samples 1000 --out samples/dit\n"
        << "Two machines, one launcher on each (machine 0 at 10.0.0.1):\n"
        << "  moh launch --nnodes 2 --node_rank 0 --nproc 8 --master_addr 10.0.0.1 -- train CONFIG.yaml --run-dir R\n"
        << "  moh launch --nnodes 2 --node_rank 1 --nproc 8 --master_addr 10.0.0.1 -- train CONFIG.yaml --run-dir R\n"
        << "With --max-restarts N, a failed rank stops every rank of the machine and they start again (training\n"
        << "resumes from its latest checkpoint), at most N times; give every machine the same N.\n"
        << "Each process gets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (docs/DISTRIBUTED.md).\n";
    return 0;
  }
  const NodePlace place = node_place(args);
  const int n = args["nproc"].as<int>();
  if (n < 1 || n > 512) throw UserError("--nproc", "must be in 1..512, got " + std::to_string(n), "");
  if (split + 1 >= argc)
    throw UserError(argv[0], "no command after --", "e.g. moh launch --nproc 2 -- train CONFIG.yaml");
  const std::string cmd = argv[split + 1];
  if (cmd != "train" && cmd != "sample" && cmd != "eval")
    throw UserError(argv[0], "cannot launch '" + cmd + "' data-parallel", "commands: train, sample, eval");
  int port = args["master-port"].as<int>();
  if (port < 0 || port > 65535) throw UserError("--master-port", "not a TCP port", "1..65535, or 0 for a free one");
  if (port == 0 && place.nnodes > 1) port = 29500;  // every machine must name the same one: torchrun's default
  if (port != 0 && place.node_rank == 0 && !port_free(port))
    throw UserError("--master_port " + std::to_string(port), "already in use on this machine",
                    "another run or program listens there: pick another port on every machine");
  const int max_restarts = args["max-restarts"].as<int>();
  if (max_restarts < 0 || max_restarts > 1000)
    throw UserError("--max-restarts " + std::to_string(max_restarts), "must be in 0..1000", "");

  std::vector<std::string> child_args;
  for (int i = split + 1; i < argc; ++i) child_args.emplace_back(argv[i]);
  std::string prefix = invoked_as() + " launch";
  if (place.nnodes > 1)
    prefix += " --nnodes " + std::to_string(place.nnodes) + " --node_rank " + std::to_string(place.node_rank) +
              " --master_addr " + place.master_addr + " --master_port " + std::to_string(port);
  return launch_local(n, port, child_args, prefix + " --nproc_per_node " + std::to_string(n) + " --", place,
                      max_restarts);
}

namespace {

// The ranks of this machine, started as children (see launch_local).
struct Ranks {
  std::vector<pid_t> pids;
  int n = 0;
  NodePlace place;
};

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
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::string threads = std::to_string(std::max(1u, cores / static_cast<unsigned>(n)));
  const pid_t launcher = ::getpid();
  Ranks ranks{{}, n, place};
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

// Waits; the first failure stops the rest: SIGTERM, then SIGKILL 10 s later. An input error (exit 2) of a rank other
// than 0 first gives rank 0 up to 30 s to fail alike and print the one error line (the other ranks stay quiet).
Outcome wait_ranks(Ranks& ranks) {
  using Clock = std::chrono::steady_clock;
  Outcome out;
  int alive = ranks.n, forwarded = 0;
  bool stopping = false, termed = false;
  auto term_at = Clock::time_point::max(), kill_at = Clock::time_point::max();
  auto signal_all = [&](int sig) {
    for (pid_t p : ranks.pids)
      if (p > 0) ::kill(p, sig);
  };
  while (alive > 0) {
    for (; forwarded < g_signals; ++forwarded) signal_all(g_last_signal);
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, stopping ? WNOHANG : 0);
    if (pid < 0 && errno == EINTR) continue;
    if (pid == 0) {  // stopping, nobody exited yet
      const auto now = Clock::now();
      if (!termed && now >= term_at) signal_all(SIGTERM), termed = true;
      if (now >= kill_at) signal_all(SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    if (pid < 0) break;
    const auto it = std::find(ranks.pids.begin(), ranks.pids.end(), pid);
    if (it == ranks.pids.end()) continue;
    const int rank = static_cast<int>(it - ranks.pids.begin());
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
                  << WTERMSIG(status) << "\n";
      out.code = code;
      out.how = WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status)) : "exit " + std::to_string(code);
      stopping = true;
      const bool wait_for_rank0 = code == kExitUserError && rank != 0 && ranks.pids[0] > 0;
      term_at = Clock::now() + std::chrono::seconds(wait_for_rank0 ? 30 : 0);
      kill_at = term_at + std::chrono::seconds(10);
    } else if (stopping && rank == 0 && code == kExitUserError) {
      out.code = code;  // rank 0 said what was wrong; stop the rest now
      term_at = std::min(term_at, Clock::now());
      kill_at = std::min(kill_at, term_at + std::chrono::seconds(10));
    }
  }
  out.on_request = out.on_request || forwarded > 0;
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

int launch_local(int n, int port, const std::vector<std::string>& args, const std::string& resume_prefix,
                 const NodePlace& place, int max_restarts) {
  if (port == 0) port = free_port();
  std::vector<std::string> command = args;
  // Ctrl-C reaches the launcher alone (the ranks get their own process group) and is forwarded once per press.
  struct sigaction sa {};
  sa.sa_handler = on_launcher_signal;
  sigemptyset(&sa.sa_mask);  // no SA_RESTART: waitpid returns EINTR and the loop forwards the signal
  g_signals = 0;
  ::sigaction(SIGINT, &sa, &g_old_int);
  ::sigaction(SIGTERM, &sa, &g_old_term);
  Outcome out;
  for (int restart = 0;; ++restart) {
    std::vector<std::string> child_args{invoked_as()};
    child_args.insert(child_args.end(), command.begin(), command.end());
    Ranks ranks = start_ranks(n, port, child_args, resume_prefix, place, restart, max_restarts);
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

std::string resume_command(int argc, char** argv, const std::string& run_dir) {
  auto quote = [](const std::string& a) {
    if (!a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") ==
                          std::string::npos)
      return a;
    std::string q = "'";
    for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  const char* prefix = std::getenv("MOH_RESUME_PREFIX");
  std::string cmd = prefix && *prefix ? std::string(prefix) : invoked_as();
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
    cmd += " " + quote(a);
  }
  if (!has_run_dir) cmd += " --run-dir " + quote(run_dir);
  return cmd + " --resume auto";
}

}  // namespace moh::apps
