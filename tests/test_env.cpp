// Linked into both test binaries: the std::filesystem guard of core/platform/run_context.h (prefer_system_libstdcxx)
// runs during static initialisation, before any test touches a temporary directory.
#include "core/platform/blas_core.h"
#include "core/platform/run_context.h"

namespace {
const bool kSystemLibstdcxx = (moh::prefer_system_libstdcxx(), true);
// The OpenBLAS core `moh` would run on (and its self-check), so that the suite tests the products users get.
const bool kCpuSetup = (moh::reexec_for_cpu_from_cmdline(), true);
}  // namespace
