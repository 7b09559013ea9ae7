// Linked into both test binaries: the std::filesystem guard of core/run_context.h (prefer_system_libstdcxx) runs
// during static initialisation, before any test touches a temporary directory.
#include "core/run_context.h"

namespace {
const bool kSystemLibstdcxx = (moh::prefer_system_libstdcxx(), true);
}  // namespace
