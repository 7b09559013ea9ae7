// `moh`: the program of apps/main.cpp (declared in apps/commands.h), whose main is its own file so that a test tool
// can hold the same program (tests/tools/zygote.cpp). Declared here rather than included: commands.h brings the
// experiment headers, and this file compiles without LibTorch's.
#include <cstdio>
#include <cstdlib>
#include <iostream>

namespace moh::apps {
int program_main(int argc, char** argv);
}

int main(int argc, char** argv) {
  const int code = moh::apps::program_main(argc, argv);
  // The program's own objects (files, writers, process groups, loader threads) are gone by here. What is left are
  // the libraries' static objects, whose destructors do nothing the process needs: LibTorch's unregister its
  // operators one by one, a pass as long as their registration. The streams are flushed and the process ends.
  std::cout.flush();
  std::cerr.flush();
  std::clog.flush();
  std::fflush(nullptr);
  std::_Exit(code);
}
