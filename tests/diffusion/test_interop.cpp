// Official-format weights in and out: a MoH-DiT state_dict written by PyTorch's torch.save (fp16, zip) loads into
// our model by its official names and reproduces PyTorch's forward pass (reference implementation and outputs in
// tests/fixtures/gen/make_torch.py); names round-trip through safetensors unchanged.
#include "core/error.h"
#include "core/io/safetensors.h"
#include "core/io/torch_file.h"
#include "core/train/checkpoint.h"
#include "diffusion/dit.h"
#include "tests/test_util.h"

namespace moh {
namespace {

std::string fixture(const std::string& name) {
  return test::source_path("tests/fixtures/torch/", name);
}

double max_rel_error(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

diffusion::DiT load_pixel_moh_dit(const TensorMap& w) {
  diffusion::DiTOptions o = diffusion::dit_options_for_weights(diffusion::dit_options("MoH-DiT-Pixel/4-75"), w);
  EXPECT_EQ(o.input_size, 28);
  EXPECT_EQ(o.in_channels, 1);
  EXPECT_EQ(o.num_classes, 10);
  diffusion::DiT model(o);
  load_module_tensors(*model, w, "fixture");
  model->eval();
  return model;
}

TEST(Interop, TorchSaveMoHDiTMatchesPyTorchForward) {
  TensorMap w = load_weights_file(fixture("moh_dit_pixel_fp16.pt"), "");
  EXPECT_EQ(w.at("blocks.0.attn.wg.weight").scalar_type(), at::kHalf);
  diffusion::DiT model = load_pixel_moh_dit(w);
  SafetensorsFile io = load_safetensors(fixture("moh_dit_pixel_io.safetensors"));
  torch::NoGradGuard ng;
  at::Tensor out = model->forward(io.tensors.at("x"), io.tensors.at("t"), io.tensors.at("y")).out;
  const at::Tensor& ref = io.tensors.at("out");
  ASSERT_EQ(out.sizes(), ref.sizes());
  EXPECT_GT(ref.abs().max().item<double>(), 0.1);  // random weights, adaLN not zeroed: a non-trivial output
  const double err = max_rel_error(out, ref);
  std::cout << "max relative error vs PyTorch: " << err << std::endl;
  EXPECT_LE(err, 1e-5);
  // The sparse MoH path (selected heads only) gives the same outputs.
  diffusion::DiTOptions o = model->options;
  o.path = AttentionPath::sparse;
  diffusion::DiT sparse(o);
  load_module_tensors(*sparse, w, "fixture");
  sparse->eval();
  EXPECT_LE(max_rel_error(sparse->forward(io.tensors.at("x"), io.tensors.at("t"), io.tensors.at("y")).out, ref), 1e-5);
}

TEST(Interop, OfficialNamesRoundTripThroughSafetensors) {
  TensorMap w = load_weights_file(fixture("moh_dit_pixel_fp16.pt"), "");
  diffusion::DiT model = load_pixel_moh_dit(w);
  TensorMap ours = module_tensors(*model);
  ASSERT_EQ(ours.size(), w.size());
  for (const auto& [name, t] : w) EXPECT_TRUE(at::equal(ours.at(name), t.to(at::kFloat))) << name;
  test::TempDir dir;
  save_safetensors(dir.file("w.safetensors"), ours);
  TensorMap back = load_weights_file(dir.file("w.safetensors"), "");
  for (const auto& [name, t] : ours) EXPECT_TRUE(at::equal(back.at(name), t)) << name;
}

TEST(Interop, MismatchesAreReportedByName) {
  TensorMap w = load_weights_file(fixture("moh_dit_pixel_fp16.pt"), "");
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // Plain DiT of the same size: the MoH routers are unexpected.
  diffusion::DiT plain(diffusion::dit_options_for_weights(diffusion::dit_options("DiT-Pixel/4"), w));
  EXPECT_NE(message([&] { load_module_tensors(*plain, w, "f"); }).find("unexpected tensor 'blocks.0.attn.wg"),
            std::string::npos);
  // A missing tensor is named; --allow-missing keeps the initialised value (here: the fixed pos_embed).
  TensorMap partial = w;
  partial.erase("pos_embed");
  diffusion::DiT moh(diffusion::dit_options_for_weights(diffusion::dit_options("MoH-DiT-Pixel/4-75"), w));
  EXPECT_NE(message([&] { load_module_tensors(*moh, partial, "f"); }).find("missing tensor 'pos_embed'"),
            std::string::npos);
  load_module_tensors(*moh, partial, "f", /*allow_missing=*/true);
  EXPECT_TRUE(
      at::allclose(moh->pos_embed, w.at("pos_embed").to(at::kFloat), 0, 1e-3));  // fp16 file vs our sin-cos init
  // Wrong shape.
  TensorMap wrong = w;
  wrong["final_layer.linear.bias"] = at::zeros({3});
  EXPECT_NE(message([&] { load_module_tensors(*moh, wrong, "f"); }).find("'final_layer.linear.bias' has shape [3]"),
            std::string::npos);
}

}  // namespace
}  // namespace moh
