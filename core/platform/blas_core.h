#pragma once
// The OpenBLAS kernel ("core") that Debian's LibTorch multiplies with. OpenBLAS picks its kernels once, when it is
// loaded, from the CPU it recognises; Debian 12's OpenBLAS 0.3.21 does not know Sapphire Rapids (and later) Xeons and
// falls back to its generic Prescott kernels, which run fp32 products about 6x slower than the AVX-512 ones the CPU
// supports. moh then re-executes itself with OPENBLAS_CORETYPE set to the best core the CPU's features allow (as it
// does for OMP_WAIT_POLICY), after checking that core's products against a plain reference in the new process: a
// core that computes wrong results, or crashes on an instruction the CPU lacks, is not used (one warning line, and
// OpenBLAS's own choice stays). A user's own OPENBLAS_CORETYPE always wins.
#include <map>
#include <set>
#include <string>

namespace moh {

/// Instruction-set level of an OpenBLAS core name: 1 SSE-only (Prescott, Core2, Nehalem, Barcelona, ...), 2 AVX
/// (SandyBridge, Bulldozer), 3 AVX2 + FMA (Haswell, Zen, Excavator), 4 AVX-512 (SkylakeX), 5 AVX-512 with BF16
/// (Cooperlake, SapphireRapids); -1 for a name this table does not know (left alone).
int openblas_core_level(const std::string& core);

/// The best OpenBLAS core for a CPU with these /proc/cpuinfo flags: Cooperlake with avx512_bf16 (fastest fp32 on a
/// Sapphire Rapids guest: docs/BENCHMARKS.md), SkylakeX with AVX-512 F/CD/BW/DQ/VL, Haswell with AVX2 + FMA,
/// SandyBridge with AVX; "" when the CPU has nothing better than SSE.
std::string best_openblas_core(const std::set<std::string>& cpu_flags);

/// The core to switch to: the best one for the flags when OpenBLAS detected a known core of a lower level; else "".
std::string openblas_core_upgrade(const std::string& detected, const std::set<std::string>& cpu_flags);

/// The flags line of /proc/cpuinfo (empty where there is none).
std::set<std::string> cpu_flags();

/// What OpenBLAS runs on in this process, for `moh --version` and benchmark records.
struct BlasCore {
  std::string detected;  ///< OpenBLAS's own choice ("" when the BLAS is not OpenBLAS)
  std::string used;      ///< openblas_get_corename() now
  std::string how;       ///< why `used`: "OpenBLAS's choice", "chosen by moh, self-check passed", "OPENBLAS_CORETYPE
                         ///< (yours)", "self-check of X failed: ..."
};
BlasCore blas_core();

/// Products of assorted shapes and layouts (fp32 and fp64, matrix and matrix-vector) through LibTorch against a plain
/// triple loop in double: "" when every one agrees within its dtype's rounding, else what failed.
std::string check_blas_products();

/// Run first thing in `moh` and the test binaries (argv = the process's own arguments): remembers them for
/// reexec_for_cpu and, in a process re-executed with a new OpenBLAS core, checks that core (re-executing once more
/// with OpenBLAS's own choice on failure, with one warning line). MOH_BLAS_SELFCHECK_INJECT=wrong|crash (tests) makes
/// the self-check see a wrong product or an illegal instruction.
void prepare_cpu_setup(char** argv);

/// What the CPU path needs in the environment and this process lacks: OMP_WAIT_POLICY=passive
/// (needs_sleeping_openmp, run_context.h) and a better OpenBLAS core; empty when nothing. MOH_BLAS_ASSUME_CORE=NAME
/// (tests) treats NAME as OpenBLAS's own choice.
std::map<std::string, std::string> cpu_env_needed();

/// Re-executes the program (the arguments prepare_cpu_setup kept) with cpu_env_needed() set, which OpenMP and
/// OpenBLAS read only when they are loaded; returns when nothing needs to change. A command calls it before its first
/// computation (those that never compute, and a launcher, skip the second start of LibTorch).
void reexec_for_cpu();

/// prepare_cpu_setup(argv) and reexec_for_cpu(): both at once, for programs that compute from the start.
void reexec_for_cpu(char** argv);

/// Sets cpu_env_needed() in this process's environment without re-executing: a launcher computes nothing itself, and
/// the processes it starts begin with what they need.
void set_cpu_env_for_children();

/// reexec_for_cpu with the arguments of /proc/self/cmdline (for static initialisation, where argv is not at hand).
void reexec_for_cpu_from_cmdline();

}  // namespace moh
