#include "core/tensor_count.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

namespace moh {

namespace {

// What the wrapper counts; never destroyed, since tensors it handed out may be freed at any later time.
struct TensorCount {
  std::mutex mutex;
  std::unordered_map<void*, size_t> sizes;
  size_t live = 0, peak = 0;
  c10::DeleterFnPtr inner_delete = nullptr;  // the wrapped allocator's, fixed at the first wrap
};

TensorCount& tensor_count() {
  static auto* count = new TensorCount;
  return *count;
}

void counted_delete(void* data) {
  TensorCount& c = tensor_count();
  {
    const std::lock_guard<std::mutex> lock(c.mutex);
    if (const auto it = c.sizes.find(data); it != c.sizes.end()) {
      c.live -= it->second;
      c.sizes.erase(it);
    }
  }
  c.inner_delete(data);
}

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define MOH_ALLOCATE_CONST
#else
#define MOH_ALLOCATE_CONST const
#endif

// The wrapped allocator's memory, its data pointer as its context (the raw contract every CPU DataPtr keeps), the
// size recorded so that the deleter can count it off.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* inner) : inner_(inner) {}
  c10::DataPtr allocate(size_t n) MOH_ALLOCATE_CONST override {
    void* data = inner_->raw_allocate(n);
    TensorCount& c = tensor_count();
    {
      const std::lock_guard<std::mutex> lock(c.mutex);
      c.sizes[data] = n;
      c.live += n;
      c.peak = std::max(c.peak, c.live);
    }
    return {data, data, &counted_delete, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &counted_delete; }
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif
  c10::Allocator* inner() const {
    return inner_;
  }

 private:
  c10::Allocator* inner_;
};

#undef MOH_ALLOCATE_CONST

// While it lives, LibTorch's CPU allocator is the counting one (installed at the lowest priority, as the default one
// is, so that it replaces only that one), and the previous one again after.
class CountingScope {
 public:
  CountingScope() : inner_(c10::GetCPUAllocator()) {
    TensorCount& c = tensor_count();
    if (!inner_->raw_deleter() || (c.inner_delete && c.inner_delete != inner_->raw_deleter())) return;
    c.inner_delete = inner_->raw_deleter();
    static auto* counting = new CountingCpuAllocator(inner_);
    if (counting->inner() != inner_) return;
    c10::SetCPUAllocator(counting, 0);
    on_ = c10::GetCPUAllocator() == counting;
  }
  ~CountingScope() {
    if (on_) c10::SetCPUAllocator(inner_, 0);
  }
  CountingScope(const CountingScope&) = delete;
  CountingScope& operator=(const CountingScope&) = delete;
  bool on() const { return on_; }

 private:
  c10::Allocator* inner_;
  bool on_ = false;
};

}  // namespace

std::optional<double> cpu_tensor_peak_during(const std::function<void()>& run) {
  const CountingScope counting;
  if (!counting.on()) {
    run();
    return std::nullopt;
  }
  TensorCount& c = tensor_count();
  size_t start = 0;
  {
    const std::lock_guard<std::mutex> lock(c.mutex);
    start = c.live;
    c.peak = c.live;
  }
  run();
  const std::lock_guard<std::mutex> lock(c.mutex);
  return static_cast<double>(c.peak - start);
}

}  // namespace moh
