#include "core/train/activation_checkpoint.h"

#include <ATen/Context.h>
#include <torch/autograd.h>

#include "core/platform/amp.h"

namespace moh {

namespace {

thread_local int t_recomputing = 0;

// What the backward pass needs besides the saved inputs, kept in the autograd context as a capsule.
struct Replay : torch::CustomClassHolder {
  TensorFn fn;
  std::vector<bool> needs_grad;
  AutocastState autocast;
  std::vector<c10::Device> rng_devices;  // the CPU, and every CUDA device an input lives on
  std::vector<at::Tensor> rng_states;    // their generators' states when the forward pass ran
};

std::vector<c10::Device> rng_devices_of(const std::vector<at::Tensor>& inputs) {
  std::vector<c10::Device> devs{c10::Device(c10::kCPU)};
  for (const auto& t : inputs)
    if (t.is_cuda() && std::find(devs.begin(), devs.end(), t.device()) == devs.end()) devs.push_back(t.device());
  return devs;
}

std::vector<at::Tensor> rng_states(const std::vector<c10::Device>& devs) {
  std::vector<at::Tensor> states;
  for (const auto& d : devs) {
    at::Generator g = at::globalContext().defaultGenerator(d);
    std::lock_guard<std::mutex> lock(g.mutex());
    states.push_back(g.get_state());
  }
  return states;
}

void set_rng_states(const std::vector<c10::Device>& devs, const std::vector<at::Tensor>& states) {
  for (size_t i = 0; i < devs.size(); ++i) {
    at::Generator g = at::globalContext().defaultGenerator(devs[i]);
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(states[i]);
  }
}

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                c10::intrusive_ptr<Replay> replay, at::TensorList list) {
    const std::vector<at::Tensor> inputs = list.vec();
    for (const auto& t : inputs) replay->needs_grad.push_back(t.requires_grad());
    replay->autocast = AutocastState::current();
    replay->rng_devices = rng_devices_of(inputs);
    replay->rng_states = rng_states(replay->rng_devices);
    ctx->save_for_backward(inputs);
    ctx->saved_data["replay"] = c10::IValue::make_capsule(replay);
    return replay->fn(inputs);  // grad mode is off here: no graph, no stored activations
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto holder = ctx->saved_data["replay"].toCapsule();
    const Replay& replay = *static_cast<Replay*>(holder.get());
    std::vector<at::Tensor> inputs = ctx->get_saved_variables();
    // The inputs' gradients are taken as the engine hands them over, before AccumulateGrad would copy them into the
    // inputs' strides: a block input that is a strided view (DiT's patch embedding plus pos_embed) would otherwise
    // pass a gradient in another memory order than the plain run, and a bf16 reduction over it (the conv's bias
    // gradient) would sum in another order.
    std::vector<at::Tensor> input_grads(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      inputs[i] = inputs[i].detach().requires_grad_(replay.needs_grad[i]);
      if (replay.needs_grad[i]) inputs[i].register_hook([&input_grads, i](const at::Tensor& g) { input_grads[i] = g; });
    }
    const std::vector<at::Tensor> now = rng_states(replay.rng_devices);  // the random stream continues afterwards
    set_rng_states(replay.rng_devices, replay.rng_states);
    std::vector<at::Tensor> outputs;
    {
      at::AutoGradMode grad(true);
      AutocastRestore autocast(replay.autocast);
      ++t_recomputing;
      try {
        outputs = replay.fn(inputs);
      } catch (...) {
        --t_recomputing;
        throw;
      }
      --t_recomputing;
    }
    set_rng_states(replay.rng_devices, now);
    std::vector<at::Tensor> roots, root_grads;
    for (size_t i = 0; i < outputs.size(); ++i)
      if (outputs[i].requires_grad() && grads[i].defined()) roots.push_back(outputs[i]), root_grads.push_back(grads[i]);
    if (!roots.empty()) torch::autograd::backward(roots, root_grads);  // parameters' .grad accumulate here
    torch::autograd::variable_list out{at::Tensor()};                  // the replay argument
    out.insert(out.end(), input_grads.begin(), input_grads.end());
    return out;
  }
};

}  // namespace

std::vector<at::Tensor> checkpointed(const TensorFn& fn, const std::vector<at::Tensor>& inputs) {
  if (!at::GradMode::is_enabled()) return fn(inputs);
  auto replay = c10::make_intrusive<Replay>();
  replay->fn = fn;
  return CheckpointFunction::apply(replay, at::TensorList(inputs));  // a TensorList: each tensor an autograd input
}

bool recomputing() {
  return t_recomputing > 0;
}

}  // namespace moh
