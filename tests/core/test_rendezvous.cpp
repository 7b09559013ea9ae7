// The rendezvous rules (pure) and the rendezvous itself through a real TCPStore with two ranks in two threads:
// machines started differently are refused on every rank with the reason, a rank that never comes is named.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>

#include "core/dist/distributed.h"
#include "core/dist/rendezvous.h"
#include "core/error.h"

namespace moh::dist {
namespace {

RankCard card(int rank, int world, const std::string& config = "abc") {
  return RankCard{rank,
                  world,
                  "h" + std::to_string(rank),
                  "10.0.0." + std::to_string(rank + 1),
                  "n" + std::to_string(rank),
                  {{"config", config}, {"start", "step 0"}},
                  0};
}

TEST(Rendezvous, CardsRoundTripAndMalformedOnesAreRefused) {
  RankCard c = card(3, 4, std::string(64, 'f'));
  c.pid = 4242;
  const RankCard d = decode_card(encode_card(c));
  EXPECT_EQ(d.pid, 4242);
  EXPECT_EQ(describe(d), "rank 3 (host h3, 10.0.0.4, pid 4242)");
  EXPECT_EQ(d.rank, 3);
  EXPECT_EQ(d.world, 4);
  EXPECT_EQ(d.host, "h3");
  EXPECT_EQ(d.address, "10.0.0.4");
  EXPECT_EQ(d.nonce, "n3");
  EXPECT_EQ(d.agree, c.agree);
  EXPECT_THROW(decode_card("1\t2\th"), std::runtime_error);
  EXPECT_THROW(decode_card("x\t2\th\ta\tn\t1"), std::runtime_error);
  EXPECT_THROW(decode_card("1\t2\th\ta\tn\t1x"), std::runtime_error);
  EXPECT_THROW(decode_card("1\t2\th\ta\tn\t1\tnoequals"), std::runtime_error);
}

TEST(Rendezvous, JudgesWorldSizeRanksAndAgreement) {
  const RankCard mine = card(0, 3);
  EXPECT_EQ(rendezvous_refusal(mine, {mine, card(2, 3)}), "");  // a missing rank is not a refusal yet
  const std::string world = rendezvous_refusal(mine, {mine, card(1, 4)});
  EXPECT_NE(world.find("rank 1 (host h1, 10.0.0.2) was started for 4 processes in all, rank 0 on h0 for 3"),
            std::string::npos)
      << world;
  EXPECT_NE(rendezvous_refusal(mine, {mine, card(1, 3), card(1, 3)}).find("rank 1 joined twice"), std::string::npos);
  EXPECT_NE(rendezvous_refusal(mine, {mine, card(5, 3)}).find("outside a world of 3"), std::string::npos);
  const std::string cfg = rendezvous_refusal(mine, {mine, card(2, 3, std::string(64, 'e'))});
  EXPECT_NE(cfg.find("rank 2 (host h2, 10.0.0.3) has another config than rank 0 on h0 (eeeeeeeeeeee… vs abc)"),
            std::string::npos)
      << cfg;
  EXPECT_EQ(missing_ranks(4, {card(0, 4), card(2, 4)}), (std::vector<int>{1, 3}));
  EXPECT_EQ(absent_ranks_refusal({1, 3}, 2.5).rfind("ranks 1, 3 did not join within 2.5 s", 0), 0u);
}

TEST(Rendezvous, AVerdictIsForTheRanksItJudgedOnly) {
  const std::vector<RankCard> cards{card(0, 2), card(1, 2)};
  const Verdict ok = decode_verdict(encode_verdict("", cards), "n1");
  EXPECT_TRUE(ok.for_me);
  EXPECT_EQ(ok.refusal, "");
  EXPECT_FALSE(decode_verdict(encode_verdict("", cards), "n7").for_me);  // an earlier incarnation's verdict
  const Verdict no = decode_verdict(encode_verdict("rank 1 is wrong", cards), "n0");
  EXPECT_TRUE(no.for_me);
  EXPECT_EQ(no.refusal, "rank 1 is wrong");
}

// Two ranks in two threads of this process meet at a TCPStore on localhost; returns each rank's error ("" = joined).
std::vector<std::string> join_two(const Agreement& a0, const Agreement& a1, int world1 = 2) {
  std::mt19937 rng(std::random_device{}());
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(31000 + static_cast<int>(rng() % 20000)).c_str(), 1);
  ::setenv("MOH_DIST_TIMEOUT", "20", 1);
  std::vector<std::string> errors(2);
  auto one = [&](int rank, int world, const Agreement& agree) {
    RunContext ctx;
    ctx.rank = rank, ctx.world = world;
    try {
      auto g = Group::join(ctx, agree);
      std::vector<double> s = g->sum({1.0});
      if (s[0] != 2.0) errors[static_cast<size_t>(rank)] = "sum " + std::to_string(s[0]);
    } catch (const UserError& e) {
      errors[static_cast<size_t>(rank)] = std::string("user error: ") + e.what();
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(rank)] = std::string("runtime error: ") + e.what();
    }
  };
  std::thread t0(one, 0, 2, a0), t1(one, 1, world1, a1);
  t0.join(), t1.join();
  ::unsetenv("MOH_DIST_TIMEOUT");
  return errors;
}

TEST(Rendezvous, TwoRanksThatAgreeJoinAndThoseThatDoNotAreBothRefused) {
  if (!available()) GTEST_SKIP() << "this build has no c10d";
  const Agreement a{{"config", "abc"}}, b{{"config", "abd"}};
  EXPECT_EQ(join_two(a, a), (std::vector<std::string>{"", ""}));
  for (const auto& e : join_two(a, b)) {
    EXPECT_EQ(e.rfind("user error: ", 0), 0u) << e;
    EXPECT_NE(e.find("has another config than rank 0"), std::string::npos) << e;
  }
  for (const auto& e : join_two(a, a, /*world1=*/3)) {
    EXPECT_EQ(e.rfind("user error: ", 0), 0u) << e;
    EXPECT_NE(e.find("was started for 3 processes in all"), std::string::npos) << e;
  }
}

TEST(Rendezvous, ARankThatNeverComesIsNamedWithinTheTimeout) {
  if (!available()) GTEST_SKIP() << "this build has no c10d";
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(31000 + static_cast<int>(std::random_device{}() % 20000)).c_str(), 1);
  ::setenv("MOH_DIST_TIMEOUT", "2", 1);
  RunContext ctx;
  ctx.rank = 0, ctx.world = 2;
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  try {
    Group::join(ctx);
  } catch (const UserError& e) {
    error = e.what();
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::unsetenv("MOH_DIST_TIMEOUT");
  EXPECT_NE(error.find("rank 1 did not join within 2 s"), std::string::npos) << error;
  EXPECT_LT(secs, 15.0);
}

}  // namespace
}  // namespace moh::dist
