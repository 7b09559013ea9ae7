#pragma once
// The process supervisor behind `moh launch` and `moh train` with train.processes > 1: a local torchrun. It starts N
// copies of this binary with the torchrun variables set, forwards Ctrl-C, stops the rest when one fails, and restarts
// a failed machine's ranks when asked (torchrun's --max-restarts).
#include <string>
#include <vector>

namespace moh {

/// This machine among several (torchrun's --nnodes / --node_rank / --master_addr): its ranks are
/// node_rank · nproc + LOCAL_RANK of nnodes · nproc, and every rank meets at master_addr:port.
struct NodePlace {
  int nnodes = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
};

/// What to start.
struct LaunchPlan {
  std::string program = "moh";    ///< argv[0] of the ranks (they run /proc/self/exe)
  int nproc = 1;                  ///< processes on this machine
  int port = 0;                   ///< MASTER_PORT; 0 = a free one (one machine only)
  std::vector<std::string> args;  ///< the command of every rank, args[0] = the subcommand
  /// What a rank prints before the `train ...` of its resume command (MOH_RESUME_PREFIX, e.g. "moh launch
  /// --nproc_per_node 2 --"); "" = the plain command.
  std::string resume_prefix;
  NodePlace place;
  /// When a rank fails (not an input error, not a forwarded Ctrl-C), every rank of this machine is stopped and
  /// started again, at most this many times, with TORCHELASTIC_RESTART_COUNT set; training restarts with
  /// `--resume auto`.
  int max_restarts = 0;
};

/// Starts the plan's ranks with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and
/// OMP_NUM_THREADS = cores / nproc unless set); children die with the launcher. Waits; the first failure stops the
/// others. SIGINT/SIGTERM reach the launcher only (the ranks run in their own process group) and are forwarded to
/// every rank once per signal, so a Ctrl-C stops training with one checkpoint and a second one exits. Returns the exit
/// code (0, or the first failing rank's).
int launch_local(const LaunchPlan& plan);

/// The intra-op threads each of `nproc` ranks started here gets unless OMP_NUM_THREADS says otherwise: the cores
/// shared out (at least 1).
int rank_threads(int nproc);

/// Whether rank 0 could open its store on `port` on this machine (a port another program listens on is not free).
bool port_free(int port);

/// The command line that resumes a training run after a stop on a signal: `program` (or MOH_RESUME_PREFIX), `train`
/// and the original arguments with `--resume auto` (and `--run-dir` when it was implicit), shell-quoted.
std::string resume_command(const std::string& program, int argc, char** argv, const std::string& run_dir);

}  // namespace moh
