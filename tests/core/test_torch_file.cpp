// torch.save reader against files written by real PyTorch (tests/fixtures/torch, made by
// tests/fixtures/gen/make_torch.py with Debian's python3-torch 1.13.1), plus a fuzzer over damaged copies.
#include <random>

#include "core/error.h"
#include "core/io/atomic_io.h"
#include "core/io/safetensors.h"
#include "core/io/torch_file.h"
#include "tests/test_util.h"

namespace moh {
namespace {

std::string fixture(const std::string& name) {
  return test::source_path("tests/fixtures/torch/", name);
}

/// The message of the UserError `f` throws ("" when it throws nothing).
template <class F>
std::string user_error(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

class TorchFormats : public ::testing::TestWithParam<std::string> {};

TEST_P(TorchFormats, EveryDtypeStridesOffsetsAndSharedStorage) {
  TorchFile f = load_torch_file(fixture("mixed_" + GetParam() + ".pt"));
  EXPECT_EQ(f.format, GetParam());
  TensorMap t = torch_state_dict(f, "", "mixed");
  ASSERT_EQ(t.size(), 16u);
  at::Tensor base = at::arange(24, at::kFloat).reshape({4, 6}) / 8;
  EXPECT_TRUE(at::equal(t["f32"], base));
  EXPECT_EQ(t["f16"].scalar_type(), at::kHalf);
  EXPECT_TRUE(at::equal(t["f16"], (base - 1).to(at::kHalf)));
  EXPECT_EQ(t["bf16"].scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(t["bf16"], (base * 3).to(at::kBFloat16)));
  EXPECT_TRUE(at::equal(t["f64"], base.to(at::kDouble) / 3));
  EXPECT_TRUE(at::equal(t["i64"], at::arange(10, at::kLong)));
  EXPECT_TRUE(at::equal(t["i32"], at::arange(-3, 3, at::kInt)));
  EXPECT_EQ(t["i16"][1].item<int64_t>(), 300);
  EXPECT_EQ(t["i8"][0].item<int64_t>(), -128);
  EXPECT_EQ(t["u8"][1].item<int64_t>(), 255);
  EXPECT_EQ(t["bool"].scalar_type(), at::kBool);
  EXPECT_TRUE(t["bool"][0].item<bool>());
  EXPECT_FALSE(t["bool"][1].item<bool>());
  // base.t(): shape (6, 4), strides (1, 6): read as a view, not copied contiguous.
  EXPECT_EQ(t["strided"].sizes(), at::IntArrayRef({6, 4}));
  EXPECT_EQ(t["strided"].strides(), at::IntArrayRef({1, 6}));
  EXPECT_TRUE(at::equal(t["strided"], base.t()));
  EXPECT_TRUE(at::equal(t["offset"], base.slice(0, 1).slice(1, 2)));
  EXPECT_TRUE(at::equal(t["view_a"], at::arange(2, 5, at::kLong)));
  EXPECT_TRUE(at::equal(t["view_b"], at::arange(4, 10, at::kLong)));
  EXPECT_EQ(t["view_a"].data_ptr<int64_t>() + 2, t["view_b"].data_ptr<int64_t>());  // one storage, as in Python
  EXPECT_EQ(t["scalar"].dim(), 0);
  EXPECT_EQ(t["scalar"].item<float>(), 2.5f);
  EXPECT_EQ(t["empty"].sizes(), at::IntArrayRef({0, 3}));
}

TEST_P(TorchFormats, NestedTrainingCheckpoint) {
  const std::string path = fixture("nested_" + GetParam() + ".pt");
  TorchFile f = load_torch_file(path);
  SafetensorsFile expected = load_safetensors(fixture("nested_expected.safetensors"));
  for (const std::string key : {"model", "ema"}) {
    TensorMap sd = torch_state_dict(f, key, path);
    ASSERT_EQ(sd.size(), 9u) << key;  // 2 Linear (w, b) + BatchNorm (w, b, mean, var, num_batches_tracked)
    for (const auto& [name, t] : sd)
      EXPECT_TRUE(at::equal(t, expected.tensors.at(key + "." + name))) << key << "." << name;
    EXPECT_EQ(sd["1.num_batches_tracked"].scalar_type(), at::kLong);
  }
  EXPECT_EQ(torch_state_dict(f, "model", path)["1.num_batches_tracked"].item<int64_t>(), 1);
  // The OrderedDict keeps its `_metadata` attribute; argparse.Namespace is an opaque record with its fields.
  PyRef model = f.root->get("model");
  ASSERT_TRUE(model && model->state && model->state->get("_metadata"));
  PyRef args = f.root->get("args");
  ASSERT_TRUE(args);
  EXPECT_EQ(args->kind, PyValue::Kind::object);
  EXPECT_EQ(args->text, "argparse.Namespace");
  ASSERT_TRUE(args->state && args->state->get("model"));
  EXPECT_EQ(args->state->get("model")->text, "DiT-S/2");
  EXPECT_EQ(f.root->get("epoch")->integer, 3);
  EXPECT_EQ(f.root->get("tag")->kind, PyValue::Kind::bytes);
  EXPECT_EQ(f.root->get("tag")->text, std::string("\x00\xff"
                                                  "bytes",
                                                  7));
  EXPECT_EQ(f.root->get("big")->kind, PyValue::Kind::big_integer);
  EXPECT_DOUBLE_EQ(f.root->get("pi")->floating, 3.141592653589793);
  PyRef params = f.root->get("params");  // a list holding an nn.Parameter
  ASSERT_TRUE(params && params->items.size() == 1);
  EXPECT_TRUE(at::equal(params->items[0]->tensor, at::ones({2})));
  // The optimizer state is a dict of dicts, not a state_dict; the error lists the entries to choose from.
  std::string err = user_error([&] { torch_state_dict(f, "", path); });
  EXPECT_NE(err.find("nested checkpoint"), std::string::npos) << err;
  EXPECT_NE(err.find("model, ema, opt, args"), std::string::npos) << err;
  EXPECT_NE(user_error([&] { torch_state_dict(f, "opt", path); }).find("not a state_dict"), std::string::npos);
  EXPECT_NE(user_error([&] { torch_state_dict(f, "emma", path); }).find("no entry 'emma'"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(ZipAndLegacy, TorchFormats, ::testing::Values("zip", "legacy"));

TEST(TorchFile, DataParallelPrefixIsRemoved) {
  TensorMap sd = load_weights_file(fixture("ddp_prefix.pt"), "");
  EXPECT_EQ(sd.size(), 9u);
  EXPECT_TRUE(sd.count("0.weight"));
}

TEST(TorchFile, DamagedFilesAreClearErrors) {
  std::string err = user_error([] { load_torch_file(fixture("truncated.pt")); });
  EXPECT_NE(err.find("truncated.pt"), std::string::npos) << err;
  err = user_error([] { load_torch_file(fixture("unsupported_opcode.pt")); });
  EXPECT_NE(err.find("unsupported pickle opcode 0x82"), std::string::npos) << err;
  err = user_error([] { load_torch_file(fixture("missing.pt")); });
  EXPECT_NE(err.find("no such file"), std::string::npos) << err;
  err = user_error([] { parse_torch_file("hello world", "text"); });
  EXPECT_NE(err.find("not a torch.save file"), std::string::npos) << err;
  // Weights with a key that only nested torch.save files have.
  err = user_error([] { load_weights_file(fixture("nested_expected.safetensors"), "ema"); });
  EXPECT_NE(err.find("weights key"), std::string::npos) << err;
}

/// Deeply nested lists (a hostile pickle) are built and destroyed without recursion.
TEST(TorchFile, DeepNestingDoesNotOverflowTheStack) {
  std::string pkl = "\x80\x02";
  const int depth = 200000;
  for (int i = 0; i < depth; ++i) pkl += "]";      // EMPTY_LIST × depth
  for (int i = 0; i < depth - 1; ++i) pkl += "a";  // APPEND: each list into the one below it
  pkl += ".";
  std::string err = user_error([&] { parse_torch_file(pkl, "deep"); });  // a legacy file needs more pickles after this
  EXPECT_FALSE(err.empty());
}

/// ≥ 1000 damaged copies of each container (byte flips, truncations): every outcome is a successful parse or a
/// UserError, never a crash, a hang or another exception. Truncations must always be errors.
TEST(TorchFile, FuzzedFilesNeverCrash) {
  for (const std::string name : {"nested_zip.pt", "nested_legacy.pt", "mixed_legacy.pt"}) {
    const std::string good = read_file(fixture(name));
    std::mt19937 rng(1234);
    int errors = 0, parsed = 0;
    for (int trial = 0; trial < 1200; ++trial) {
      std::string bad = good;
      const bool truncate = trial % 3 == 0;
      if (truncate) {
        bad.resize(std::uniform_int_distribution<size_t>(0, good.size() - 1)(rng));
      } else {
        const int flips = 1 + trial % 4;
        for (int k = 0; k < flips; ++k) {
          const size_t pos = std::uniform_int_distribution<size_t>(0, good.size() - 1)(rng);
          bad[pos] = static_cast<char>(bad[pos] ^ (1 << std::uniform_int_distribution<int>(0, 7)(rng)));
        }
      }
      try {
        TorchFile f = parse_torch_file(bad, "fuzz");
        EXPECT_FALSE(truncate) << name << ": a truncated copy of " << bad.size() << " bytes parsed";
        ++parsed;
      } catch (const UserError&) {
        ++errors;
      } catch (const std::exception& e) {
        ADD_FAILURE() << name << " trial " << trial << ": " << e.what();
      }
    }
    // Flips in a zip member are caught by its CRC-32; the legacy format has no checksum, so a flip inside raw
    // tensor bytes (or a string's text) still parses: those count as `parsed`.
    std::cout << name << ": " << errors << " errors, " << parsed << " parsed of 1200 damaged copies" << std::endl;
    EXPECT_GE(errors, 400);
  }
}

}  // namespace
}  // namespace moh
