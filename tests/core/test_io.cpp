// safetensors round trip (every dtype), hand-written bytes, malformed/truncated/fuzzed files; atomic writers.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "core/error.h"
#include "core/io/atomic_io.h"
#include "core/io/safetensors.h"
#include "core/parse.h"
#include "datasets/fashion_mnist.h"
#include "tests/test_util.h"

#include <torch/version.h>

namespace moh {
namespace {

using test::TempDir;

// The one parser of numbers users write: the whole text or nothing.
TEST(Parse, WholeTextOrNothing) {
  EXPECT_EQ(parse_int("250"), 250);
  EXPECT_EQ(parse_int("-3"), -3);
  EXPECT_EQ(parse_int("9223372036854775807"), INT64_MAX);
  for (const char* bad : {"", " 1", "1 ", "+1", "12x", "1.0", "0x10", "9223372036854775808", "-"})
    EXPECT_FALSE(parse_int(bad).has_value()) << "'" << bad << "'";
  EXPECT_EQ(parse_double("0.5"), 0.5);
  EXPECT_EQ(parse_double("2e-4"), 2e-4);
  EXPECT_EQ(parse_double(".5"), 0.5);
  EXPECT_EQ(parse_double("-1"), -1.0);
  for (const char* bad : {"", "fast", "1,5", " 0.5", "0.5s", "inf", "nan", "1e999", "+1"})
    EXPECT_FALSE(parse_double(bad).has_value()) << "'" << bad << "'";
}

TEST(Safetensors, RoundTripEveryDtype) {
  TempDir d;
  TensorMap in;
  torch::manual_seed(0);
  in["f64"] = torch::randn({3, 4}, torch::kDouble);
  in["f32"] = torch::randn({2, 3, 5});
  in["f16"] = torch::randn({7}).to(torch::kHalf);
  in["bf16"] = torch::randn({2, 2}).to(torch::kBFloat16);
  in["i64"] = torch::randint(-1000, 1000, {5}, torch::kLong);
  in["i32"] = torch::randint(-1000, 1000, {5}, torch::kInt);
  in["i16"] = torch::randint(-1000, 1000, {5}, torch::kShort);
  in["i8"] = torch::randint(-100, 100, {5}, torch::kChar);
  in["u8"] = torch::randint(0, 255, {4, 4}, torch::kByte);
  in["bool"] = torch::randint(0, 2, {6}).to(torch::kBool);
  in["scalar"] = torch::tensor(3.5);
  in["empty"] = torch::zeros({0, 3});
  in["strided"] = torch::arange(12, torch::kFloat).view({3, 4}).t();  // non-contiguous
  save_safetensors(d.file("a.safetensors"), in, {{"format", "pt"}, {"step", "12"}});
  SafetensorsFile out = load_safetensors(d.file("a.safetensors"));
  ASSERT_EQ(out.tensors.size(), in.size());
  for (const auto& [k, v] : in) {
    ASSERT_TRUE(out.tensors.count(k)) << k;
    EXPECT_EQ(out.tensors[k].scalar_type(), v.scalar_type()) << k;
    EXPECT_EQ(out.tensors[k].sizes(), v.sizes()) << k;
    EXPECT_TRUE(torch::equal(out.tensors[k], v.contiguous())) << k;
  }
  EXPECT_EQ(out.metadata.at("step"), "12");
}

// Files written by the `safetensors` Python package (0.8.0, torch 2.14.1; tests/core/ref_safetensors.py write):
// every dtype, IEEE specials, integer extremes, empty and 0-d tensors, non-ASCII metadata. The dtypes this LibTorch
// lacks (float8 < 2.1, uint16/32/64 < 2.3) are a one-line user error naming the LibTorch that has them.
TEST(Safetensors, ReadsFilesWrittenByThePythonPackage) {
  const std::string dir = test::source_path("tests/fixtures/safetensors/");
  SafetensorsFile f = load_safetensors(dir + "py_basic.safetensors");
  EXPECT_EQ(f.metadata.at("note"), "\u00fcn\u00efc\u00f6d\u00e9 \u2713");
  EXPECT_EQ(f.metadata.at("written_by"), "safetensors.torch.save_file");
  const TensorMap& t = f.tensors;
  EXPECT_EQ(t.size(), 18u);
  EXPECT_EQ(t.at("i64")[0].item<int64_t>(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(t.at("i64")[1].item<int64_t>(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(t.at("i32")[0].item<int32_t>(), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(t.at("i16")[1].item<int16_t>(), 32767);
  EXPECT_EQ(t.at("i8")[0].item<int8_t>(), -128);
  EXPECT_EQ(t.at("u8")[1].item<uint8_t>(), 255);
  const at::Tensor sp = t.at("f32_special");
  EXPECT_TRUE(std::signbit(sp[1].item<float>()) && sp[1].item<float>() == 0.0f);  // -0.0 kept
  EXPECT_TRUE(std::isinf(sp[4].item<float>()) && std::isnan(sp[6].item<float>()));
  EXPECT_EQ(sp[7].item<float>(), 1e-42f);  // subnormal
  EXPECT_EQ(t.at("f16_special").scalar_type(), at::kHalf);
  EXPECT_EQ(t.at("f16_special")[2].item<float>(), 65504.0f);
  EXPECT_EQ(t.at("bf16_special").scalar_type(), at::kBFloat16);
  EXPECT_EQ(t.at("bf16_special")[3].item<float>(), -2.25f);
  EXPECT_EQ(t.at("bool").scalar_type(), at::kBool);
  EXPECT_TRUE(t.at("bool")[0][0].item<bool>() && !t.at("bool")[0][1].item<bool>());
  EXPECT_EQ(t.at("empty").sizes(), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(t.at("empty_i64").sizes(), (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(t.at("scalar").dim(), 0);
  EXPECT_EQ(t.at("scalar").item<float>(), 2.5f);
  EXPECT_EQ(t.at("scalar_i32").item<int32_t>(), -7);
  EXPECT_EQ(t.at("c64").scalar_type(), at::kComplexFloat);
  EXPECT_EQ(t.at("f64").scalar_type(), at::kDouble);
  // Written back by us, the bytes are the package's bytes (same header order rules aside): same tensors again.
  TempDir d;
  save_safetensors(d.file("back.safetensors"), t, f.metadata);
  const SafetensorsFile back = load_safetensors(d.file("back.safetensors"));
  for (const auto& [k, v] : t) {
    const at::Tensor a = v.contiguous(), b = back.tensors.at(k).contiguous();
    ASSERT_EQ(a.scalar_type(), b.scalar_type()) << k;
    ASSERT_EQ(a.sizes(), b.sizes()) << k;
    EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * a.element_size()), 0) << k;  // NaN payloads too
  }
  EXPECT_EQ(back.metadata, f.metadata);

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  const TensorMap all = load_safetensors(dir + "py_all.safetensors").tensors;
  EXPECT_EQ(all.size(), 25u);
  EXPECT_EQ(all.at("f8_e4m3").scalar_type(), at::kFloat8_e4m3fn);
  EXPECT_EQ(all.at("f8_e4m3").to(at::kFloat)[3].item<float>(), 448.0f);
  EXPECT_EQ(all.at("f8_e5m2").to(at::kFloat)[3].item<float>(), 57344.0f);
  EXPECT_EQ(all.at("f8_e4m3fnuz").to(at::kFloat)[3].item<float>(), 240.0f);
  EXPECT_EQ(all.at("f8_e5m2fnuz").scalar_type(), at::kFloat8_e5m2fnuz);
  EXPECT_EQ(all.at("u16").scalar_type(), at::kUInt16);
  EXPECT_EQ(all.at("u32").scalar_type(), at::kUInt32);
  EXPECT_EQ(all.at("u64").scalar_type(), at::kUInt64);
  uint64_t u64 = 0;
  std::memcpy(&u64, static_cast<const char*>(all.at("u64").data_ptr()) + 8, 8);
  EXPECT_EQ(u64, (uint64_t{1} << 63) + 5);
#else
  try {
    load_safetensors(dir + "py_all.safetensors");
    ADD_FAILURE() << "float8 / uint16-64 tensors loaded into a LibTorch without those dtypes";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported dtype F8_E4M3 in LibTorch"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("needs LibTorch 2.1 or newer"), std::string::npos) << e.what();
  }
#endif
}

// The on-disk layout follows the format rules: u64 LE header length, JSON, data with offsets from data start.
TEST(Safetensors, LayoutMatchesFormatRules) {
  TensorMap m{{"a", torch::tensor({1.0f, 2.0f})}, {"b", torch::tensor({int64_t{7}})}};
  std::string bytes = safetensors_bytes(m);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  ASSERT_EQ(n % 8, 0u);
  std::string header = bytes.substr(8, n);
  EXPECT_NE(header.find("\"a\":{\"data_offsets\":[0,8],\"dtype\":\"F32\",\"shape\":[2]}"), std::string::npos) << header;
  EXPECT_NE(header.find("\"b\":{\"data_offsets\":[8,16],\"dtype\":\"I64\",\"shape\":[1]}"), std::string::npos);
  EXPECT_EQ(bytes.size(), 8 + n + 16);
  float f[2];
  std::memcpy(f, bytes.data() + 8 + n, 8);
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[1], 2.0f);
}

// A file written by hand, byte by byte, as another implementation would.
TEST(Safetensors, HandWrittenBytesLoad) {
  std::string json = R"({"__metadata__":{"who":"hand"},"w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},)"
                     R"("x":{"dtype":"I32","shape":[1,1],"data_offsets":[4,8]}})";
  std::string bytes;
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  bytes += json;
  const unsigned char data[8] = {0x00, 0x3c, 0x00, 0xc0, 0x2a, 0x00, 0x00, 0x00};  // f16 1.0, -2.0 ; i32 42
  bytes.append(reinterpret_cast<const char*>(data), 8);
  auto f = parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "hand");
  EXPECT_EQ(f.metadata.at("who"), "hand");
  EXPECT_EQ(f.tensors.at("w").scalar_type(), torch::kHalf);
  EXPECT_FLOAT_EQ(f.tensors.at("w")[0].item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(f.tensors.at("w")[1].item<float>(), -2.0f);
  EXPECT_EQ(f.tensors.at("x").sizes(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(f.tensors.at("x").item<int>(), 42);
}

std::string with_header(const std::string& json, size_t data_bytes) {
  std::string b;
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return b + json + std::string(data_bytes, '\0');
}

TEST(Safetensors, MalformedFilesAreUserErrors) {
  auto parse = [](const std::string& b) {
    return parse_safetensors(reinterpret_cast<const uint8_t*>(b.data()), b.size(), "bad");
  };
  EXPECT_THROW(parse(""), UserError);
  EXPECT_THROW(parse("abc"), UserError);
  EXPECT_THROW(parse(std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}"), UserError);  // huge header length
  EXPECT_THROW(parse(with_header("{not json", 0)), UserError);
  EXPECT_THROW(parse(with_header("[1,2]", 0)), UserError);
  EXPECT_THROW(parse(with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4)), UserError);
  EXPECT_THROW(parse(with_header(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)), UserError);
  EXPECT_THROW(parse(with_header(R"({"a":{"dtype":"X9","shape":[2],"data_offsets":[0,8]}})", 8)), UserError);
  EXPECT_THROW(parse(with_header(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8)), UserError);
  EXPECT_THROW(parse(with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8)), UserError);
  EXPECT_THROW(parse(with_header(R"({"a":{"dtype":"F32","shape":[2]}})", 8)), UserError);
  EXPECT_THROW(parse(with_header(R"({"__metadata__":{"k":1}})", 0)), UserError);
  EXPECT_THROW(parse(with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                 12)),
               UserError);
  EXPECT_THROW(parse(with_header(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8)),
               UserError);
}

// Truncations and random byte flips of a valid file never crash: each parse succeeds or throws UserError.
TEST(Safetensors, FuzzedInputsNeverCrash) {
  TensorMap m{{"w", torch::randn({4, 3})}, {"b", torch::arange(5)}, {"h", torch::ones({2}).to(torch::kHalf)}};
  const std::string good = safetensors_bytes(m, {{"k", "v"}});
  std::mt19937 rng(123);
  int errors = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string b = good;
    if (i % 2 == 0) {
      b.resize(rng() % good.size());
    } else {
      for (int f = 0, flips = 1 + rng() % 4; f < flips; ++f) b[rng() % b.size()] = static_cast<char>(rng() & 0xff);
    }
    try {
      parse_safetensors(reinterpret_cast<const uint8_t*>(b.data()), b.size(), "fuzz");
    } catch (const UserError&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 1000);
}

TEST(AtomicIO, FileReplaceIsAllOrNothing) {
  TempDir d;
  write_file_atomic(d.file("x"), "old");
  write_file_atomic(d.file("x"), "new");
  EXPECT_EQ(read_file(d.file("x")), "new");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(d.path), {}), 1);  // no temporaries left
}

// A writer killed mid-way (after writing part of the new content, before commit) leaves the old content intact.
TEST(AtomicIO, KilledWriterLeavesOldContent) {
  TempDir d;
  const std::string ckpt = d.file("ckpt");
  {
    AtomicDir first(ckpt);
    test::TempDir::counter();
    std::ofstream(first.path() + "/weights") << "old weights";
    first.commit();
  }
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    AtomicDir second(ckpt, /*replace=*/true);
    std::ofstream(second.path() + "/weights") << "new wei";  // partial
    ::kill(::getpid(), SIGKILL);                             // dies before commit()
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(read_file(ckpt + "/weights"), "old weights");
  remove_stale_temporaries(d.path.string());
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(d.path), {}), 1);
  // A completed replacement swaps the content.
  {
    AtomicDir third(ckpt, true);
    std::ofstream(third.path() + "/weights") << "new weights";
    third.commit();
  }
  EXPECT_EQ(read_file(ckpt + "/weights"), "new weights");
  AtomicDir refused(ckpt);
  EXPECT_THROW(refused.commit(), std::runtime_error);  // no silent overwrite without replace=true
}

TEST(FashionMnist, ReadsDebianPackageAndRejectsCorruptFiles) {
  if (!std::filesystem::exists(std::string(datasets::kFashionMnistDir) + "/t10k-labels-idx1-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  auto test = datasets::load_fashion_mnist("test");
  EXPECT_EQ(test.images.sizes(), (std::vector<int64_t>{10000, 28, 28}));
  EXPECT_EQ(test.labels.size(0), 10000);
  EXPECT_EQ(test.labels.bincount().min().item<int64_t>(), 1000);  // balanced test set
  TempDir d;
  std::string bytes = read_file(std::string(datasets::kFashionMnistDir) + "/t10k-labels-idx1-ubyte.gz");
  d.write("t10k-labels-idx1-ubyte.gz", bytes.substr(0, bytes.size() / 2));
  d.write("t10k-images-idx3-ubyte.gz",
          read_file(std::string(datasets::kFashionMnistDir) + "/t10k-images-idx3-ubyte.gz"));
  try {
    datasets::load_fashion_mnist("test", d.path.string());
    FAIL() << "truncated file accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("apt-get install dataset-fashion-mnist"), std::string::npos) << e.what();
  }
  EXPECT_THROW(datasets::load_fashion_mnist("test", d.file("missing")), UserError);
}

}  // namespace
}  // namespace moh
