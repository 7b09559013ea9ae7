#pragma once
// The rendezvous of a data-parallel run, before the backend connects its ranks: every rank leaves a card at the
// master's TCPStore (who it is, where it runs, what it believes about the run), rank 0 reads the cards as they come
// and writes one verdict, and each rank goes on or stops with rank 0's reason. This is where machines that were
// started differently are refused in one line (another world size, another config, another starting checkpoint, two
// machines with the same --node_rank) instead of hanging in the backend's connect or training two different runs.
//
// A verdict names the nonce of every card it judged: a rank that reaches the store of an earlier incarnation of the
// run (its rank 0 not yet gone after a restart) sees a verdict without its nonce and tries again.
#include <string>
#include <utility>
#include <vector>

namespace moh::dist {

/// Named values every rank of a run must share, e.g. {"config", sha256 of the resolved YAML}, {"start", "step 8"}.
using Agreement = std::vector<std::pair<std::string, std::string>>;

/// What one rank tells the others when it joins.
struct RankCard {
  int rank = 0, world = 1;
  std::string host;     ///< the machine's name (gethostname)
  std::string address;  ///< where its backend listens
  std::string nonce;    ///< random per process
  Agreement agree;
  int pid = 0;  ///< its process id (for lines about a rank that stopped answering)
};

/// One line of text and back (tab-separated; values must hold no tab or newline). decode throws std::runtime_error.
std::string encode_card(const RankCard& card);
RankCard decode_card(const std::string& text);

/// "rank 1 (host h1, 10.0.0.2, pid 4242)" for messages (no pid when 0).
std::string describe(const RankCard& card);

/// Judges the cards that have arrived so far (any order), against rank 0's `mine`: "" while nothing is wrong, else
/// the reason in one sentence: another world size, a rank outside the world or taken twice, an agreement value that
/// differs (named, with both values shortened). Missing ranks are not judged here (see missing_ranks).
std::string rendezvous_refusal(const RankCard& mine, const std::vector<RankCard>& cards);

/// The ranks of 0 … world-1 without a card, ascending.
std::vector<int> missing_ranks(int world, const std::vector<RankCard>& cards);

/// The refusal for ranks that never came: "rank 1, 3 did not join within 20 s (…)".
std::string absent_ranks_refusal(const std::vector<int>& missing, double seconds);

/// The verdict rank 0 writes: "ok" or "refused: <reason>", then the nonces it judged.
std::string encode_verdict(const std::string& refusal, const std::vector<RankCard>& cards);
/// A rank's reading of a verdict: whether it is for this rank (its nonce is listed) and rank 0's refusal ("" = ok).
struct Verdict {
  bool for_me = false;
  std::string refusal;
};
Verdict decode_verdict(const std::string& text, const std::string& my_nonce);

}  // namespace moh::dist
