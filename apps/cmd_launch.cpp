// `moh launch --nproc N [--master-port P] -- <moh subcommand> ARGS...`: a local torchrun. Starts N copies of this
// binary with RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT set (and OMP_NUM_THREADS = cores / N unless
// given), forwards their output, and when one exits with an error stops the others and returns that exit code.
// On several machines, one launcher per machine: --nnodes M --node_rank R --master_addr HOST0 --master_port P.
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/dist/launcher.h"
#include "core/error.h"
#include "core/parse.h"

namespace moh::apps {

namespace {

// --nnodes / --node_rank / --master_addr, checked.
NodePlace node_place(const cxxopts::ParseResult& args) {
  NodePlace p;
  const std::string nnodes = args["nnodes"].as<std::string>();
  const size_t colon = nnodes.find(':');
  const std::string lo = nnodes.substr(0, colon), hi = colon == std::string::npos ? lo : nnodes.substr(colon + 1);
  const std::optional<int64_t> count = parse_int(lo);
  if (lo != hi || !count || *count > 9999)
    throw UserError("--nnodes " + nnodes, "must be a number of machines (M, or M:M; elastic ranges are not supported)",
                    "e.g. --nnodes 2");
  p.nnodes = static_cast<int>(*count);
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
  auto flag = opts.add_options();
  flag("nproc,nproc_per_node,nproc-per-node", "number of processes (torchrun: --nproc_per_node)",
       cxxopts::value<int>()->default_value("2"));
  flag("master-port,master_port", "TCPStore port (0 = a free one on one machine, 29500 on several)",
       cxxopts::value<int>()->default_value("0"));
  flag("nnodes", "machines taking part, one launcher on each (M or M:M)",
       cxxopts::value<std::string>()->default_value("1"));
  flag("node_rank,node-rank", "this machine's index, 0 … M-1 (0 hosts the rendezvous)",
       cxxopts::value<int>()->default_value("0"));
  flag("master_addr,master-addr", "address of machine 0, reachable from every machine",
       cxxopts::value<std::string>()->default_value("127.0.0.1"));
  flag("max-restarts,max_restarts",
       "when a rank fails, stop every rank and start them again, at most N times "
       "(torchrun's meaning; training resumes from its latest checkpoint)",
       cxxopts::value<int>()->default_value("0"));
  flag("standalone", "torchrun's single-machine flag (one machine)");
  flag("h,help", "show this help");
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

  LaunchPlan plan;
  plan.program = invoked_as();
  plan.nproc = n, plan.port = port, plan.place = place, plan.max_restarts = max_restarts;
  for (int i = split + 1; i < argc; ++i) plan.args.emplace_back(argv[i]);
  plan.resume_prefix = invoked_as() + " launch";
  if (place.nnodes > 1)
    plan.resume_prefix += " --nnodes " + std::to_string(place.nnodes) + " --node_rank " +
                          std::to_string(place.node_rank) + " --master_addr " + place.master_addr + " --master_port " +
                          std::to_string(port);
  plan.resume_prefix += " --nproc_per_node " + std::to_string(n) + " --";
  return launch_local(plan);
}

}  // namespace moh::apps
