#include "core/dist/rendezvous.h"

#include <algorithm>
#include <set>
#include <sstream>
#include <stdexcept>

namespace moh::dist {

namespace {

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::string field;
  std::istringstream in(text);
  while (std::getline(in, field, sep)) out.push_back(field);
  if (!text.empty() && text.back() == sep) out.emplace_back();
  return out;
}

// A long value (a sha256) shortened for a message.
std::string brief(const std::string& v) {
  return v.size() > 16 ? v.substr(0, 12) + "…" : v;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < 8; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return ranks.size() > 8 ? s + ", …" : s;
}

// The first agreement value of `card` that differs from rank 0's, described; "" if none.
std::string disagreement(const RankCard& mine, const RankCard& card) {
  for (const auto& [name, value] : mine.agree) {
    std::string theirs = "(none)";
    for (const auto& [n, v] : card.agree)
      if (n == name) theirs = v;
    if (theirs != value)
      return describe(card) + " has another " + name + " than rank 0 on " + mine.host + " (" + brief(theirs) + " vs " +
             brief(value) + "): start every machine with the same command and files";
  }
  return "";
}

}  // namespace

std::string encode_card(const RankCard& c) {
  std::string s = std::to_string(c.rank);
  for (const std::string& f : {std::to_string(c.world), c.host, c.address, c.nonce, std::to_string(c.pid)})
    s += "\t", s += f;
  for (const auto& [name, value] : c.agree) s += "\t" + name + "=" + value;
  return s;
}

RankCard decode_card(const std::string& text) {
  const auto f = split(text, '\t');
  if (f.size() < 6) throw std::runtime_error("malformed rendezvous card: " + text.substr(0, 80));
  RankCard c;
  try {
    size_t used = 0;
    c.rank = std::stoi(f[0]), c.world = std::stoi(f[1]), c.pid = std::stoi(f[5], &used);
    if (used != f[5].size()) throw std::invalid_argument("pid");
  } catch (const std::exception&) {
    throw std::runtime_error("malformed rendezvous card: " + text.substr(0, 80));
  }
  c.host = f[2], c.address = f[3], c.nonce = f[4];
  for (size_t i = 6; i < f.size(); ++i) {
    const size_t eq = f[i].find('=');
    if (eq == std::string::npos) throw std::runtime_error("malformed rendezvous card: " + text.substr(0, 80));
    c.agree.emplace_back(f[i].substr(0, eq), f[i].substr(eq + 1));
  }
  return c;
}

std::string describe(const RankCard& c) {
  // Appended piece by piece: GCC 12 warns falsely about one long chain of std::string sums (-Wstringop-overflow).
  std::string s = "rank ";
  s += std::to_string(c.rank);
  s += " (host ";
  s += c.host;
  if (!c.address.empty()) s += ", ", s += c.address;
  if (c.pid > 0) s += ", pid ", s += std::to_string(c.pid);
  s += ")";
  return s;
}

std::string rendezvous_refusal(const RankCard& mine, const std::vector<RankCard>& cards) {
  std::set<int> seen;
  for (const auto& c : cards) {
    if (c.world != mine.world)
      return describe(c) + " was started for " + std::to_string(c.world) + " processes in all, rank 0 on " + mine.host +
             " for " + std::to_string(mine.world) + ": --nnodes × --nproc_per_node must be the same on every machine";
    if (c.rank < 0 || c.rank >= mine.world)
      return describe(c) + " is outside a world of " + std::to_string(mine.world) + " processes";
    if (!seen.insert(c.rank).second)
      return "rank " + std::to_string(c.rank) + " joined twice (" + c.host +
             " is one of them): give every machine its own --node_rank";
    if (const std::string d = disagreement(mine, c); !d.empty()) return d;
  }
  return "";
}

std::vector<int> missing_ranks(int world, const std::vector<RankCard>& cards) {
  std::vector<int> out;
  for (int r = 0; r < world; ++r)
    if (std::none_of(cards.begin(), cards.end(), [r](const RankCard& c) { return c.rank == r; })) out.push_back(r);
  return out;
}

std::string absent_ranks_refusal(const std::vector<int>& missing, double seconds) {
  std::ostringstream t;
  t << seconds;
  return "rank" + std::string(missing.size() > 1 ? "s " : " ") + rank_list(missing) + " did not join within " +
         t.str() +
         " s (is every machine started, with the same --master_addr and --master_port, and can it reach that port?)";
}

std::string encode_verdict(const std::string& refusal, const std::vector<RankCard>& cards) {
  std::string s = refusal.empty() ? "ok" : "refused: " + refusal;
  for (const auto& c : cards) s += "\n" + c.nonce;
  return s;
}

Verdict decode_verdict(const std::string& text, const std::string& my_nonce) {
  const auto lines = split(text, '\n');
  Verdict v;
  if (lines.empty()) return v;
  v.for_me = std::find(lines.begin() + 1, lines.end(), my_nonce) != lines.end();
  if (lines[0] != "ok") v.refusal = lines[0].rfind("refused: ", 0) == 0 ? lines[0].substr(9) : lines[0];
  return v;
}

}  // namespace moh::dist
