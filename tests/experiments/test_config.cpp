// Config system: base inheritance, overrides, and one failing example per error kind / validation rule.
#include "core/config_schema.h"
#include "experiments/experiment_config.h"
#include "tests/test_util.h"

namespace moh {
namespace {

using test::TempDir;

using test::user_error_of;

TEST(Config, BaseInheritanceMultiLevelAndOverrides) {
  TempDir d;
  d.write("base/root.yaml", "version: 1\noptim:\n  lr: 0.002\n  weight_decay: 0.1\ndata:\n  batch_size: 64\n");
  d.write("base/mid.yaml", "base: root.yaml\noptim:\n  lr: 0.003\ntrain:\n  epochs: 7\n");
  std::string leaf =
      d.write("exp/leaf.yaml", "base: ../base/mid.yaml\nmodel:\n  name: DiT-S/2\n  attention: [moh, mha]\n");
  experiments::ExperimentConfig c =
      experiments::load_experiment(leaf, {"train.epochs=9", "optim.betas=[0.8, 0.95]", "model.attention_path=sparse"});
  EXPECT_EQ(c.model.name, "DiT-S/2");
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.003);          // mid overrides root
  EXPECT_DOUBLE_EQ(c.optim.weight_decay, 0.1);  // from root
  EXPECT_EQ(c.data.batch_size, 64);
  EXPECT_EQ(c.train.epochs, 9);  // --set wins
  EXPECT_EQ(c.optim.betas, (std::vector<double>{0.8, 0.95}));
  EXPECT_EQ(c.model.attention_path, AttentionPath::sparse);
  EXPECT_EQ(experiments::load_experiment(leaf).model.attention_path, AttentionPath::automatic);  // the default: auto
  EXPECT_EQ(experiments::load_experiment(leaf, {"model.attention_path=auto"}).model.attention_path,
            AttentionPath::automatic);
  ASSERT_EQ(c.model.attention.size(), 2u);
  EXPECT_EQ(c.model.attention[0], AttentionMode::moh);
  EXPECT_EQ(c.name, "leaf");
  // The resolved YAML parses back to the same values.
  std::string again = d.write("resolved.yaml", experiments::to_yaml(c));
  experiments::ExperimentConfig c2 = experiments::load_experiment(again);
  EXPECT_EQ(experiments::to_yaml(c2), experiments::to_yaml(c));
}

TEST(Config, UnknownKeySuggestsNearest) {
  TempDir d;
  std::string f = d.write("a.yaml", "model:\n  name: DiT-S/2\n");
  std::string e = user_error_of([&] { experiments::load_experiment(f, {"optim.lrr=1"}); });
  EXPECT_NE(e.find("unknown key 'optim.lrr'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'optim.lr'?"), std::string::npos) << e;
  EXPECT_EQ(e.rfind("error: config " + f, 0), 0u) << e;
  std::string e2 = user_error_of(
      [&] { experiments::load_experiment(d.write("b.yaml", "model:\n  name: x\nzzz_totally_new: 1\n")); });
  EXPECT_NE(e2.find("unknown key 'zzz_totally_new'"), std::string::npos) << e2;
}

TEST(Config, WrongTypeNamesPathAndExpectedType) {
  TempDir d;
  std::string f = d.write("a.yaml", "model:\n  name: DiT-S/2\noptim:\n  lr: fast\n");
  std::string e = user_error_of([&] { experiments::load_experiment(f); });
  EXPECT_NE(e.find("optim.lr: expected a number, got \"fast\""), std::string::npos) << e;
  e = user_error_of([&] { experiments::load_experiment(f, {"optim.lr=1e-3", "data.batch_size=1.5"}); });
  EXPECT_NE(e.find("data.batch_size: expected an integer"), std::string::npos) << e;
  e = user_error_of([&] { experiments::load_experiment(f, {"optim.lr=1e-3", "model.attention_path=sparce"}); });
  EXPECT_NE(e.find("expected one of dense|sparse"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'sparse'"), std::string::npos) << e;
  e = user_error_of([&] { experiments::load_experiment(f, {"optim.lr=1e-3", "optim=3"}); });
  EXPECT_NE(e.find("optim: expected a map"), std::string::npos) << e;
  e = user_error_of([&] { experiments::load_experiment(f, {"optim.lr=1e-3", "train.ema_decay=[1]"}); });
  EXPECT_NE(e.find("train.ema_decay: expected a number, got a list"), std::string::npos) << e;
}

TEST(Config, NonFiniteNumbersAndDuplicateKeys) {
  test::TempDir d;
  const std::string f = d.write("a.yaml", "version: 1\nmodel:\n  name: DiT-S/2\n");
  for (const char* kv : {"optim.lr=.inf", "schedule.min_lr=.nan", "sampling.cfg_scale=-.inf", "optim.lr=1e39",
                         "optim.betas=[.nan, 0.9]"}) {
    const std::string e = user_error_of([&] { experiments::load_experiment(f, {kv}); });
    EXPECT_NE(e.find(std::string(kv).substr(0, std::string(kv).find('='))), std::string::npos) << kv << ": " << e;
  }
  // Finite but outside the key's range: refused with the range.
  EXPECT_NE(user_error_of([&] { experiments::load_experiment(f, {"optim.lr=3e38"}); }).find("is outside [0, 10]"),
            std::string::npos);
  // yaml-cpp keeps the first of two equal keys; a config must not mean something else than it says.
  EXPECT_NE(user_error_of([&] {
              experiments::load_experiment(d.write("b.yaml", "model:\n  name: x\nmodel:\n  name: y\n"));
            }).find("key 'model' appears twice"),
            std::string::npos);
  EXPECT_NE(user_error_of([&] { experiments::load_experiment(f, {"optim={lr: 1, lr: 2}"}); }).find("appears twice"),
            std::string::npos);
  // What a resume reports: the changed leaves, old -> new (lists compared whole).
  experiments::ExperimentConfig a = experiments::load_experiment(f),
                                b = experiments::load_experiment(f, {"optim.lr=0.5", "optim.betas=[0.9, 0.95]"});
  const std::vector<ConfigChange> ch = config_changes(experiments::to_yaml(a), experiments::to_yaml(b));
  ASSERT_EQ(ch.size(), 2u);
  EXPECT_EQ(ch[0].key, "optim.betas");
  EXPECT_EQ(ch[1].key, "optim.lr");
  EXPECT_EQ(ch[1].after, "0.5");
}

TEST(Config, MissingRequiredKey) {
  TempDir d;
  std::string e = user_error_of([&] { experiments::load_experiment(d.write("a.yaml", "optim:\n  lr: 0.1\n")); });
  EXPECT_NE(e.find("missing required key 'model.name'"), std::string::npos) << e;
}

TEST(Config, FileErrors) {
  TempDir d;
  EXPECT_NE(user_error_of([&] { experiments::load_experiment(d.file("nope.yaml")); }).find("file not found"),
            std::string::npos);
  std::string bad = d.write("bad.yaml", "model: [unclosed\n");
  EXPECT_NE(user_error_of([&] { experiments::load_experiment(bad); }).find("YAML syntax error"), std::string::npos);
  d.write("c1.yaml", "base: c2.yaml\n");
  std::string c2 = d.write("c2.yaml", "base: c1.yaml\n");
  EXPECT_NE(user_error_of([&] { experiments::load_experiment(c2); }).find("cycle"), std::string::npos);
  std::string ok = d.write("ok.yaml", "model:\n  name: x\n");
  EXPECT_NE(user_error_of([&] { experiments::load_experiment(ok, {"noequals"}); }).find("expected KEY=VALUE"),
            std::string::npos);
}

// Hostile files are refused before anything walks them: an alias chain that expands to 9^9 nodes, nesting past the
// limit, a file over 1 MiB, a NUL byte, bytes that are not UTF-8. Trees just under the limits load.
TEST(Config, HostileYamlIsRefusedByItsLimits) {
  TempDir d;
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n";
  for (char k = 'b', p = 'a'; k <= 'i'; p = k++) {
    bomb += std::string(1, k) + ": &" + k + " [";
    for (int i = 0; i < 9; ++i) bomb += std::string(i ? ", *" : "*") + p;
    bomb += "]\n";
  }
  const auto refused = [&](const std::string& name, const std::string& text, const std::string& why) {
    const std::string e = user_error_of([&] { experiments::load_experiment(d.write(name, text)); });
    EXPECT_NE(e.find(why), std::string::npos) << name << ": " << e;
  };
  refused("bomb.yaml", bomb, "more than 100000 YAML nodes once aliases are expanded");
  std::string deep, deeper;
  for (int i = 0; i < 70; ++i) deep += std::string(2 * i, ' ') + "k:\n";
  refused("deep.yaml", deep, "nested deeper than 64 levels");
  refused("big.yaml", std::string(config::kMaxConfigBytes + 1, '#'), "over the limit of 1 MiB");
  refused("nul.yaml", std::string("model:\n  name: x\0\n", 18), "a NUL byte at offset 16");
  refused("latin.yaml", "model:\n  name: caf\xe9\n", "not UTF-8 text (byte 18)");
  std::string flow = bomb;  // the same document as one flow mapping, given to --set
  for (size_t j = flow.find('\n'); j + 1 < flow.size(); j = flow.find('\n', j)) flow.replace(j, 1, ", ");
  flow = "{" + flow.substr(0, flow.size() - 1) + "}";
  const std::string ok = d.write("ok.yaml", "model:\n  name: x\n");
  EXPECT_NE(
      user_error_of([&] { experiments::load_experiment(ok, {"model.x=" + flow}); }).find("YAML nodes once aliases"),
      std::string::npos);
  // Within the limits: 60 levels, 9^4 expanded nodes, UTF-8 text; these fail later, for their content.
  std::string fine;
  for (int i = 0; i < 60; ++i) fine += std::string(2 * i, ' ') + "k:\n";
  EXPECT_NE(user_error_of([&] { experiments::load_experiment(d.write("fine.yaml", fine)); }).find("missing required"),
            std::string::npos);
  std::string small = bomb.substr(0, bomb.find("\ne:") + 1) + "name: café\n";
  EXPECT_NE(user_error_of([&] { experiments::load_experiment(d.write("small.yaml", small)); }).find("missing required"),
            std::string::npos);
}

// Every validate() rule has a failing example.
TEST(Config, ValidationRules) {
  TempDir d;
  std::string f = d.write("a.yaml", "model:\n  name: DiT-S/2\n");
  const std::vector<std::pair<std::string, std::string>> cases{
      {"version=2", "version"},
      {"optim.lr=-1", "optim.lr"},
      {"optim.lr=0", "optim.lr"},
      {"optim.weight_decay=-0.1", "optim.weight_decay"},
      {"optim.betas=[0.9]", "optim.betas"},
      {"optim.betas=[0.9, 1.0]", "optim.betas"},
      {"optim.eps=0", "optim.eps"},
      {"optim.clip_grad=-1", "optim.clip_grad"},
      {"schedule.warmup_epochs=-1", "schedule.warmup_epochs"},
      {"schedule.min_lr=1", "schedule.min_lr"},
      {"schedule.warmup_lr=-1", "schedule.warmup_lr"},
      {"schedule.warmup_epochs=400", "schedule.warmup_epochs"},
      {"data.batch_size=0", "data.batch_size"},
      {"train.accum_steps=0", "train.accum_steps"},
      {"train.accum_steps=3", "train.accum_steps"},
      {"data.num_workers=-1", "data.num_workers"},
      {"data.max_bad_fraction=2", "data.max_bad_fraction"},
      {"data.limit_train=-5", "data.limit_train"},
      {"train.epochs=0", "train.epochs"},
      {"train.moh_loss_coeff=-0.01", "train.moh_loss_coeff"},
      {"train.ema_decay=1", "train.ema_decay"},
      {"train.ckpt_every_epochs=0", "train.ckpt_every_epochs"},
      {"train.log_every_steps=0", "train.log_every_steps"},
      {"model.num_classes=-1", "model.num_classes"},
      {"model.img_size=-1", "model.img_size"},
      {"model.drop_path=1.5", "model.drop_path"},
      {"train.device=tpu", "train.device"},
      {"train.label_smoothing=1", "train.label_smoothing"},
      {"train.eval_every_epochs=0", "train.eval_every_epochs"},
      {"train.max_steps=-1", "train.max_steps"},
      {"data.eval_batch_size=0", "data.eval_batch_size"},
      {"data.shift=-2", "data.shift"},
  };
  for (const auto& [set, key] : cases) {
    std::string e = user_error_of([&] { experiments::load_experiment(f, {set}); });
    EXPECT_NE(e.find(": " + key + ":"), std::string::npos) << set << " -> " << e;
  }
  EXPECT_NO_THROW(experiments::load_experiment(f));
}

TEST(Config, SchemaListsEveryKeyWithDefaults) {
  auto rows = config::list_schema<experiments::ExperimentConfig>();
  bool found_lr = false;
  for (const auto& r : rows) {
    EXPECT_FALSE(r.help.empty()) << r.key;
    if (r.key == "optim.lr") {
      found_lr = true;
      EXPECT_EQ(r.default_value, "0.001");
      EXPECT_EQ(r.type, "number in [0, 10]");
    }
    // Every number a config holds has a range (the reader enforces it; moh config --schema prints it).
    if (r.type.find("integer") != std::string::npos || r.type.find("number") != std::string::npos) {
      EXPECT_NE(r.type.find(" in ["), std::string::npos) << r.key << " (" << r.type << ") has no range";
    }
  }
  EXPECT_TRUE(found_lr);
}

TEST(Config, DoublesPrintShortestRoundTrip) {
  EXPECT_EQ(config::shortest_double(0.1), "0.1");
  EXPECT_EQ(config::shortest_double(1e-3), "0.001");
  EXPECT_EQ(config::shortest_double(2.0), "2.0");
  EXPECT_EQ(config::shortest_double(1e-8), "1e-08");
  // Ordinary magnitudes print in plain decimals even where %g's shortest form is an exponent ("5e+01").
  EXPECT_EQ(config::shortest_double(50.0), "50.0");
  EXPECT_EQ(config::shortest_double(1500.0), "1500.0");
  EXPECT_EQ(config::shortest_double(-300.0), "-300.0");
  EXPECT_EQ(config::shortest_double(1e-4), "0.0001");
  EXPECT_EQ(std::strtod(config::shortest_double(1.0 / 3).c_str(), nullptr), 1.0 / 3);
}

TEST(Config, EditDistanceAndNearest) {
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(nearest_name("optim.lrr", {"optim.lr", "optim.eps"}), "optim.lr");
  EXPECT_EQ(nearest_name("completely_else", {"optim.lr"}), "");
}

}  // namespace
}  // namespace moh
