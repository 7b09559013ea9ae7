#include "core/dist/distributed.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>

#include "core/dist/rendezvous.h"
#include "core/dist/wait_report.h"
#include "core/environment.h"
#include "core/error.h"
#include "core/parse.h"
#include "core/platform/rng_state.h"

#ifdef MOH_WITH_C10D
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#endif

namespace moh::dist {

namespace {

// The single-process stand-in: every collective is the identity.
class LocalGroup : public Group {
 public:
  LocalGroup() : Group(0, 1) {}
  std::string backend() const override { return "local"; }
  void barrier() override {}

 protected:
  void backend_allreduce_sum_(std::vector<at::Tensor>&) override {}
  void backend_broadcast_(std::vector<at::Tensor>&, int) override {}
};

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

#ifdef MOH_WITH_C10D
// The address this host's Gloo device listens on: the local end of the route to the master (a UDP socket "connected"
// there sends nothing), so that the other hosts can reach it — the master's own address on the master's host, this
// host's address on the master's network elsewhere. Binding every rank to MASTER_ADDR works on one machine only.
std::string gloo_listen_address(const std::string& master, int port) {
  if (master == "localhost") return "127.0.0.1";
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  if (::getaddrinfo(master.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) return master;
  std::string local = master;
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in me{};
  socklen_t len = sizeof me;
  char text[INET_ADDRSTRLEN] = {};
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0 &&
      ::inet_ntop(AF_INET, &me.sin_addr, text, sizeof text))
    local = text;
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  return local;
}

using Clock = std::chrono::steady_clock;

std::vector<uint8_t> bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}
std::string text(const std::vector<uint8_t>& b) {
  return std::string(b.begin(), b.end());
}
std::string first_line(const std::string& s) {
  const std::string line = s.substr(0, s.find('\n'));
  return line.size() > 160 ? line.substr(0, 160) + "…" : line;
}

// Ends the process with one line when what it guards outlives `seconds`. LibTorch 1.13's TCPStore reads its answers
// without a timeout: a peer that accepted the connection and then went silent (another program on the port, a
// master cut off by the network) would otherwise hang the rank for ever.
class Watchdog {
 public:
  Watchdog(double seconds, std::string message)
      : thread_([this, seconds, message = std::move(message)] {
          std::unique_lock<std::mutex> lock(mutex_);
          if (cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done_; })) return;
          const char* rank = std::getenv("RANK");
          std::cerr << "error: " << (rank && std::string(rank) != "0" ? "rank " + std::string(rank) + ": " : "")
                    << message << std::endl;
          std::_Exit(kExitRuntime);
        }) {}
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

// The ranks that did not report the same failure within a few seconds: those that died or cannot be reached. Each
// rank that sees a collective fail leaves a mark at the store first (rank 0 holds the store: if it is gone, so is
// rank 0).
std::string lost_ranks(c10d::Store& store, const std::vector<RankCard>& cards, int me, const std::string& failure) {
  std::vector<RankCard> lost;
  std::string master = "rank 0";
  for (const auto& c : cards)
    if (c.rank == 0) master = describe(c);
  const Watchdog silent_store(20, failure + ": lost " + master + ", which holds the rendezvous (its store is silent)");
  try {
    store.setTimeout(std::chrono::seconds(5));
    store.set("moh/failed/" + std::to_string(me), bytes("1"));
    const auto until = Clock::now() + std::chrono::seconds(5);
    do {
      lost.clear();
      for (const auto& c : cards)
        if (c.rank != me && !store.check({"moh/failed/" + std::to_string(c.rank)})) lost.push_back(c);
      if (!lost.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    } while (!lost.empty() && Clock::now() < until);
  } catch (const std::exception&) {
    return "lost " + master + ", which holds the rendezvous";
  }
  if (lost.empty()) return "every rank saw it fail (a timeout?)";
  std::string s = "lost ";
  for (size_t i = 0; i < lost.size() && i < 4; ++i) s += (i ? ", " : "") + describe(lost[i]);
  return lost.size() > 4 ? s + ", …" : s;
}

// How a waiting rank posts and reads collective numbers: through the run's store, under keys of their own.
WaitReportIO wait_report_io(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<RankCard>& cards, int rank,
                            int world) {
  const auto key = [](int r) { return "moh/wait/" + std::to_string(r); };
  const auto who = [cards](int r) {
    for (const auto& c : cards)
      if (c.rank == r) return describe(c);
    return "rank " + std::to_string(r);
  };
  WaitReportIO io;
  io.post = [store, key, rank](int64_t n) { store->set(key(rank), bytes(std::to_string(n))); };
  io.read = [store, key, world] {
    std::vector<int64_t> posted(static_cast<size_t>(world), -1);
    for (int r = 0; r < world; ++r)
      if (store->check({key(r)})) posted[static_cast<size_t>(r)] = std::stoll(text(store->get(key(r))));
    return posted;
  };
  io.describe = who;
  io.store_holder = who(0);
  return io;
}

WaitReportTimes wait_times(double timeout_s) {
  WaitReportTimes t;
  t.give_up_s = timeout_s;
  return t;
}

// A c10d process group. Backend errors (a peer that died, a timeout) surface as one-line runtime errors naming the
// ranks that were lost and their hosts.
template <class PG>
class C10dGroup : public Group {
 public:
  C10dGroup(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<PG> pg, const RunContext& ctx, c10::Device device,
            std::string name, std::vector<RankCard> cards, double timeout_s)
      : Group(ctx.rank, ctx.world, device),
        store_(std::move(store)),
        pg_(std::move(pg)),
        name_(std::move(name)),
        cards_(std::move(cards)),
        waits_(ctx.rank, wait_report_io(store_, cards_, ctx.rank, ctx.world), wait_times(timeout_s),
               [](const std::string& line) { std::cerr << line << std::endl; }) {}
  std::string backend() const override { return name_; }
  void barrier() override {
    run("barrier", [&] { pg_->barrier()->wait(); });
  }

 protected:
  bool alone() const override { return false; }  // a group of one joined on purpose goes through the backend
  void backend_allreduce_sum_(std::vector<at::Tensor>& tensors) override {
    run("all-reduce", [&] {
      std::vector<std::vector<at::Tensor>> args;
      for (auto& t : tensors) args.push_back({t});
      std::vector<decltype(pg_->allreduce(args.front()))> works;  // all in flight, then waited for
      for (auto& a : args) works.push_back(pg_->allreduce(a));
      for (auto& w : works) w->wait();
    });
  }
  void backend_broadcast_(std::vector<at::Tensor>& tensors, int root) override {
    run("broadcast", [&] {
      c10d::BroadcastOptions o;
      o.rootRank = root;
      for (auto& t : tensors) {
        std::vector<at::Tensor> one{t};
        pg_->broadcast(one, o)->wait();
      }
    });
  }

 private:
  template <class F>
  void run(const char* what, F&& f) {
    std::string cause;
    waits_.begin(what);
    struct Ended {
      WaitReporter& w;
      ~Ended() { w.end(); }
    } ended{waits_};
    try {
      f();
      return;
    } catch (const c10::Error& e) {
      cause = e.what_without_backtrace();
    } catch (const std::exception& e) {
      cause = e.what();
    }
    const std::string failure = std::string("data-parallel ") + what + " failed on rank " + std::to_string(rank_) +
                                " of " + std::to_string(world_);
    throw std::runtime_error(failure + ": " + lost_ranks(*store_, cards_, rank_, failure) + " [" + first_line(cause) +
                             "]");
  }
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<PG> pg_;
  std::string name_;
  std::vector<RankCard> cards_;
  WaitReporter waits_;  // last: its thread may read the members above
};

// The socket error inside a c10d message ("errno: 113 - No route to host"), else its first line.
std::string socket_cause(const std::string& what) {
  const size_t at = what.find("errno: ");
  if (at == std::string::npos) return first_line(what);
  return what.substr(at, what.find(')', at) == std::string::npos ? std::string::npos : what.find(')', at) - at);
}

double seconds_until(Clock::time_point t) {
  return std::chrono::duration<double>(t - Clock::now()).count();
}

// Rank 0 opens the TCPStore at MASTER_PORT; the others connect to it, retrying until the deadline.
c10::intrusive_ptr<c10d::Store> open_store(const std::string& host, int port, const RunContext& ctx,
                                           Clock::time_point deadline) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(port);
  so.isServer = ctx.rank == 0;
  so.numWorkers = static_cast<size_t>(ctx.world);
  so.waitWorkers = false;  // the rendezvous below waits, and says who is missing
  so.timeout = std::chrono::milliseconds(std::max<int64_t>(1000, static_cast<int64_t>(1000 * seconds_until(deadline))));
  const std::string at = host + ":" + std::to_string(port);
  try {
    return c10::make_intrusive<c10d::TCPStore>(host, so);
  } catch (const std::exception& e) {
    if (ctx.rank == 0)
      throw std::runtime_error("cannot open the rendezvous on port " + std::to_string(port) + ": " +
                               socket_cause(e.what()) + " (is the port in use? pick another --master_port)");
    throw std::runtime_error("cannot reach the master at " + at + ": " + socket_cause(e.what()) +
                             " (is machine 0 up, --master_addr its address on this network, the port open?)");
  }
}

std::string random_nonce() {
  std::random_device rd;
  char buf[40];
  std::snprintf(buf, sizeof buf, "%08x%08x-%d", rd(), rd(), static_cast<int>(::getpid()));
  return buf;
}

// Rank 0: the cards as they arrive, until every rank has one, something is wrong, or the deadline; `refusal` says
// what was wrong ("" when nothing).
std::vector<RankCard> collect_cards(c10d::Store& store, const RankCard& mine, Clock::time_point deadline,
                                    double timeout_s, std::string& refusal) {
  std::vector<RankCard> cards;
  while (true) {
    const int64_t joined = store.add("moh/rdzv/joined", 0);
    while (static_cast<int64_t>(cards.size()) < joined)
      cards.push_back(decode_card(text(store.get("moh/rdzv/slot/" + std::to_string(cards.size())))));
    refusal = rendezvous_refusal(mine, cards);
    const std::vector<int> missing = missing_ranks(mine.world, cards);
    if (!refusal.empty() || missing.empty()) return cards;
    if (Clock::now() >= deadline) {
      refusal = absent_ranks_refusal(missing, timeout_s);
      return cards;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Rank 0 writes the verdict and, on a refusal, gives the others a moment to read it before its store goes away.
void publish_verdict(c10d::Store& store, const std::string& refusal, const std::vector<RankCard>& cards) {
  store.set("moh/rdzv/verdict", bytes(encode_verdict(refusal, cards)));
  if (refusal.empty()) return;
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (Clock::now() < until && store.add("moh/rdzv/read", 0) < static_cast<int64_t>(cards.size()) - 1)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

struct Rendezvous {
  c10::intrusive_ptr<c10d::Store> store;
  std::vector<RankCard> cards;
};

// One attempt of a rank other than 0 against the store it reached: the cards, or nothing when that store belongs
// to an earlier incarnation of the run (its verdict does not list this rank's nonce).
std::optional<std::vector<RankCard>> await_verdict(c10d::Store& store, const RankCard& mine) {
  const Verdict v = decode_verdict(text(store.get("moh/rdzv/verdict")), mine.nonce);
  if (!v.for_me) return std::nullopt;
  store.add("moh/rdzv/read", 1);
  if (!v.refusal.empty()) throw UserError("rendezvous", v.refusal);
  std::vector<RankCard> cards;
  const int64_t joined = store.add("moh/rdzv/joined", 0);
  for (int64_t i = 0; i < joined; ++i)
    cards.push_back(decode_card(text(store.get("moh/rdzv/slot/" + std::to_string(i)))));
  return cards;
}

Rendezvous rendezvous(const RunContext& ctx, const std::string& host, int port, const Agreement& agree,
                      double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  const RankCard mine{
      ctx.rank, ctx.world, name, gloo_listen_address(host, port), random_nonce(), agree, static_cast<int>(::getpid())};
  while (true) {
    Rendezvous r{open_store(host, port, ctx, deadline), {}};
    const auto leave_card = [&] {
      const int64_t slot = r.store->add("moh/rdzv/joined", 1) - 1;
      r.store->set("moh/rdzv/slot/" + std::to_string(slot), bytes(encode_card(mine)));
    };
    if (ctx.rank == 0) {
      leave_card();
      std::string refusal;
      r.cards = collect_cards(*r.store, mine, deadline, timeout_s, refusal);
      publish_verdict(*r.store, refusal, r.cards);
      if (!refusal.empty()) throw UserError("rendezvous", refusal);
      return r;
    }
    try {
      leave_card();
      if (auto cards = await_verdict(*r.store, mine)) {
        r.cards = std::move(*cards);
        return r;
      }
    } catch (const UserError&) {
      throw;
    } catch (const std::exception& e) {  // the store went away (an earlier rank 0 that was stopping): try again
      if (Clock::now() >= deadline)
        throw std::runtime_error("no verdict from rank 0 at " + host + ":" + std::to_string(port) + " within " +
                                 std::to_string(static_cast<int>(timeout_s)) + " s: " + first_line(e.what()));
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}
#endif

}  // namespace

namespace {
std::atomic<bool> g_met_other_ranks{false};
}  // namespace

bool met_other_ranks() {
  return g_met_other_ranks;
}

bool available() {
#ifdef MOH_WITH_C10D
  return true;
#else
  return false;
#endif
}

std::shared_ptr<Group> Group::join(const RunContext& ctx, const Agreement& agree, bool even_alone) {
  if (ctx.world <= 1 && !even_alone) return std::make_shared<LocalGroup>();
#ifndef MOH_WITH_C10D
  (void)agree;
  throw UserError("WORLD_SIZE=" + std::to_string(ctx.world), "this build has no c10d process groups",
                  "install libgloo-dev (Debian) and rebuild, or run one process");
#else
  const std::string host = env_or("MASTER_ADDR", "127.0.0.1");
  const std::string port_s = env_or("MASTER_PORT", "29500");
  const int port = static_cast<int>(env_number("MASTER_PORT").value_or(29500));  // both in core/environment.h's ranges
  const double timeout_s = env_number("MOH_DIST_TIMEOUT").value_or(300);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  Rendezvous rdzv;
  {
    const Watchdog silent_store(timeout_s + 10, "no answer from the rendezvous at " + host + ":" + port_s + " within " +
                                                    std::to_string(static_cast<int>(timeout_s + 10)) +
                                                    " s (does another program hold that port on machine 0?)");
    g_met_other_ranks = true;
    rdzv = rendezvous(ctx, host, port, agree, timeout_s);
  }
  rdzv.store->setTimeout(timeout);
  auto pg_store = c10::make_intrusive<c10d::PrefixStore>("moh/pg", rdzv.store);
#ifdef USE_C10D_NCCL
  if (ctx.device.is_cuda()) {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(pg_store, ctx.rank, ctx.world, opts);
    return std::make_shared<C10dGroup<c10d::ProcessGroupNCCL>>(rdzv.store, pg, ctx, ctx.device, "nccl",
                                                               std::move(rdzv.cards), timeout_s);
  }
#endif
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  const std::string ifname = env_or("GLOO_SOCKET_IFNAME", "");  // torchrun's variable: an interface by name
  const auto mine = std::find_if(rdzv.cards.begin(), rdzv.cards.end(), [&](const RankCard& c) {
    return c.rank == ctx.rank;
  });  // the address this rank announced at the rendezvous is the one it listens on
  const std::string address = mine != rdzv.cards.end() ? mine->address : gloo_listen_address(host, port);
  opts->devices.push_back(ifname.empty() ? c10d::ProcessGroupGloo::createDeviceForHostname(address)
                                         : c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(pg_store, ctx.rank, ctx.world, opts);
  return std::make_shared<C10dGroup<c10d::ProcessGroupGloo>>(rdzv.store, pg, ctx, c10::Device(c10::kCPU), "gloo",
                                                             std::move(rdzv.cards), timeout_s);
#endif
}

template <class Op>
void Group::on_backend(std::vector<at::Tensor>& tensors, Op&& op) {
  std::vector<at::Tensor> moved;
  moved.reserve(tensors.size());
  for (const auto& t : tensors) moved.push_back(to_backend(t));
  op(moved);
  for (size_t i = 0; i < tensors.size(); ++i)
    if (!moved[i].is_same(tensors[i])) tensors[i].copy_(from_backend(moved[i], tensors[i].device()));
}

void Group::allreduce_sum_(std::vector<at::Tensor>& tensors) {
  if (alone() || tensors.empty()) return;
  torch::NoGradGuard ng;
  on_backend(tensors, [&](std::vector<at::Tensor>& t) { backend_allreduce_sum_(t); });
}

void Group::broadcast_(std::vector<at::Tensor>& tensors, int root) {
  if (alone() || tensors.empty()) return;
  torch::NoGradGuard ng;
  on_backend(tensors, [&](std::vector<at::Tensor>& t) { backend_broadcast_(t, root); });
}

std::vector<double> Group::sum(const std::vector<double>& values) {
  if (alone() || values.empty()) return values;
  std::vector<at::Tensor> t{at::tensor(values, at::kDouble)};
  allreduce_sum_(t);
  const double* p = t[0].data_ptr<double>();
  return std::vector<double>(p, p + values.size());
}

void Group::broadcast_module(torch::nn::Module& module) {
  if (alone()) return;
  std::vector<at::Tensor> all;
  for (auto& p : module.parameters()) all.push_back(p.detach());
  for (auto& b : module.buffers()) all.push_back(b);
  broadcast_(all, 0);
}

void Group::average_gradients(const std::vector<at::Tensor>& params, int64_t bucket_bytes) {
  if (alone()) return;
  torch::NoGradGuard ng;
  // Buckets of consecutive parameters with the same dtype/device, flattened, all reduced together, then copied back.
  std::vector<std::vector<at::Tensor>> buckets;
  std::vector<at::Tensor> flats;
  int64_t bytes = 0;
  for (const auto& p : params) {
    if (!p.requires_grad()) continue;
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    const at::Tensor& g = p.grad();
    const bool fits = !buckets.empty() && bytes + g.nbytes() <= static_cast<size_t>(bucket_bytes) &&
                      buckets.back().front().scalar_type() == g.scalar_type() &&
                      buckets.back().front().device() == g.device();
    if (!fits) buckets.emplace_back(), bytes = 0;
    buckets.back().push_back(g);
    bytes += static_cast<int64_t>(g.nbytes());
  }
  for (const auto& b : buckets) {
    std::vector<at::Tensor> flat_parts;
    for (const auto& g : b) flat_parts.push_back(g.reshape({-1}));
    flats.push_back(at::cat(flat_parts));
  }
  allreduce_sum_(flats);
  for (size_t i = 0; i < buckets.size(); ++i) {
    flats[i].div_(static_cast<double>(world_));
    int64_t offset = 0;
    for (auto& g : buckets[i]) {
      g.copy_(flats[i].narrow(0, offset, g.numel()).view_as(g));
      offset += g.numel();
    }
  }
}

at::Tensor Group::gather_cat(const at::Tensor& block) {
  if (alone()) return block;
  std::vector<double> counts(static_cast<size_t>(world_), 0.0);
  counts[static_cast<size_t>(rank_)] = static_cast<double>(block.size(0));
  counts = sum(counts);
  const auto longest = static_cast<int64_t>(*std::max_element(counts.begin(), counts.end()));
  // Every rank writes its block into its own slot of a zero tensor; the sum is the gather (one writer per slot, so
  // the block's own dtype cannot overflow).
  std::vector<int64_t> shape{world_, longest};
  for (int64_t d = 1; d < block.dim(); ++d) shape.push_back(block.size(d));
  std::vector<at::Tensor> t{at::zeros(shape, block.options())};
  t[0][rank_].narrow(0, 0, block.size(0)).copy_(block);
  allreduce_sum_(t);
  std::vector<at::Tensor> parts;
  for (int r = 0; r < world_; ++r)
    parts.push_back(t[0][r].narrow(0, 0, static_cast<int64_t>(counts[static_cast<size_t>(r)])));
  return at::cat(parts);
}

std::map<std::string, at::Tensor> gather_rng_states(Group& group, const c10::Device& device, bool per_rank) {
  std::map<std::string, at::Tensor> out{{"cpu", cpu_rng_state()}};
  if (device.is_cuda()) out["cuda"] = device_rng_state(device);
  if (per_rank) {
    out["cpu_ranks"] = group.gather_cat(out["cpu"].unsqueeze(0));
    if (device.is_cuda()) out["cuda_ranks"] = group.gather_cat(out["cuda"].unsqueeze(0));
  }
  return out;
}

void restore_rank_rng(Group& group, const std::map<std::string, at::Tensor>* rng, uint64_t seed, int64_t step,
                      bool per_rank, const c10::Device& device) {
  const bool cuda = device.is_cuda();
  if (rng && rng->count("cpu")) set_cpu_rng_state(rng->at("cpu"));
  if (cuda && rng && rng->count("cuda")) set_device_rng_state(device, rng->at("cuda"));
  if (!per_rank || group.rank() == 0) return;
  const auto r = static_cast<uint64_t>(group.rank());
  if (!rng) {
    at::manual_seed(seed + 1000 * r);  // the CPU's and every GPU's generator
    return;
  }
  const uint64_t reseed = seed + 1000 * r + 7919 * static_cast<uint64_t>(step);  // another world size: fresh streams
  auto own_row = [&](const char* key) {
    const auto it = rng->find(key);
    return it != rng->end() && it->second.dim() == 2 && it->second.size(0) == group.world()
               ? it->second[group.rank()].contiguous()
               : at::Tensor();
  };
  const at::Tensor cpu_row = own_row("cpu_ranks");
  if (cpu_row.defined())
    set_cpu_rng_state(cpu_row);
  else
    at::manual_seed(reseed);
  if (!cuda) return;
  const at::Tensor cuda_row = own_row("cuda_ranks");
  if (cuda_row.defined())
    set_device_rng_state(device, cuda_row);
  else
    seed_device_rng(device, reseed);
}

}  // namespace moh::dist
