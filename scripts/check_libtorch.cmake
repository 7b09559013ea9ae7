# Refuses a LibTorch this toolkit cannot be built against, with one clear message instead of a page of compile or
# link errors later (included by the top-level CMakeLists.txt right after find_package(Torch)). Checked:
#   - version: LibTorch 1.13 or newer (Debian 12's libtorch-dev is 1.13.1; the pip wheels are 2.x);
#   - one LibTorch: the Caffe2 package (the libraries) belongs to the same install as the Torch package;
#   - C++ ABI: the new (CXX11) libstdc++ ABI, as Debian's yaml-cpp/OpenCV/GoogleTest are built with;
#   - C++ standard: C++20 where its headers demand it (2.10 on);
#   - CUDA: a CUDA LibTorch needs a CUDA toolkit of the same major version (nvcc builds vision/cuda/ against it and
#     the binary loads one libcudart).
# Sets MOH_TORCH_CUDA_VERSION ("" for a CPU LibTorch) for the summary line.

set(_moh_fix_hint "point -DTorch_DIR at <prefix>/share/cmake/Torch of a LibTorch ≥ 1.13 (scripts/setup.sh with MOH_LIBTORCH=pip installs a tested one)")

if(Torch_VERSION AND Torch_VERSION VERSION_LESS 1.13)
  message(FATAL_ERROR "moh: LibTorch ${Torch_VERSION} (${Torch_DIR}) is too old: this toolkit needs 1.13 or newer (${_moh_fix_hint})")
endif()

if(Caffe2_DIR AND Torch_DIR)
  get_filename_component(_moh_torch_root "${Torch_DIR}/.." REALPATH)
  get_filename_component(_moh_caffe2_root "${Caffe2_DIR}/.." REALPATH)
  if(NOT _moh_torch_root STREQUAL _moh_caffe2_root)
    message(FATAL_ERROR "moh: two LibTorch installs are mixed: Torch from ${Torch_DIR} but Caffe2 (its libraries) from "
                        "${Caffe2_DIR} (set -DCaffe2_DIR=${_moh_torch_root}/Caffe2, or clear the build dir's cache)")
  endif()
endif()

if(TORCH_CXX_FLAGS MATCHES "_GLIBCXX_USE_CXX11_ABI=0")
  message(FATAL_ERROR "moh: LibTorch ${Torch_VERSION} (${Torch_DIR}) is built with the old C++ ABI "
                      "(-D_GLIBCXX_USE_CXX11_ABI=0); yaml-cpp, OpenCV and GoogleTest from Debian use the new one, so "
                      "nothing would link (use a cxx11-ABI LibTorch: the pip wheels from torch 2.7 on, or the "
                      "'cxx11 ABI' libtorch zip)")
endif()

# LibTorch ≥ 2.10 headers refuse anything older than C++20 ("#error C++20 or later compatible compiler is required").
# The toolkit's code is C++17 and compiles unchanged as C++20; build it as C++20 against such a LibTorch.
foreach(_moh_inc ${TORCH_INCLUDE_DIRS})
  if(EXISTS "${_moh_inc}/ATen/ATen.h")
    file(STRINGS "${_moh_inc}/ATen/ATen.h" _moh_needs_cxx20 REGEX "C\\+\\+20 or later")
    if(_moh_needs_cxx20)
      set(CMAKE_CXX_STANDARD 20)
      message(STATUS "moh: LibTorch ${Torch_VERSION} needs C++20: building as C++20")
    endif()
    break()
  endif()
endforeach()

set(MOH_TORCH_CUDA_VERSION "")
if(TARGET torch_cuda)
  # The CUDA version LibTorch was built with: torch/version.py of a pip wheel, build-version of a libtorch zip.
  get_filename_component(_moh_prefix "${Torch_DIR}/../../.." REALPATH)
  if(EXISTS "${_moh_prefix}/version.py")
    file(STRINGS "${_moh_prefix}/version.py" _moh_line REGEX "^cuda")
    string(REGEX MATCH "'([0-9]+\\.[0-9]+)'" _moh_m "${_moh_line}")
    set(MOH_TORCH_CUDA_VERSION "${CMAKE_MATCH_1}")
  elseif(EXISTS "${_moh_prefix}/build-version")
    file(READ "${_moh_prefix}/build-version" _moh_line)
    if(_moh_line MATCHES "\\+cu([0-9]+)([0-9])")
      set(MOH_TORCH_CUDA_VERSION "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
    endif()
  endif()
  if(MOH_TORCH_CUDA_VERSION AND CUDAToolkit_VERSION)
    string(REGEX MATCH "^[0-9]+" _moh_torch_major "${MOH_TORCH_CUDA_VERSION}")
    string(REGEX MATCH "^[0-9]+" _moh_kit_major "${CUDAToolkit_VERSION}")
    if(NOT _moh_torch_major STREQUAL _moh_kit_major)
      message(FATAL_ERROR "moh: LibTorch ${Torch_VERSION} is built with CUDA ${MOH_TORCH_CUDA_VERSION} but the CUDA "
                          "toolkit found is ${CUDAToolkit_VERSION} (${CUDAToolkit_BIN_DIR}): the CUDA kernels and "
                          "LibTorch would load two different CUDA runtimes (install a LibTorch built for CUDA "
                          "${_moh_kit_major}.x, or point CUDAToolkit_ROOT / CUDACXX at a CUDA ${_moh_torch_major}.x toolkit)")
    endif()
  elseif(NOT MOH_TORCH_CUDA_VERSION)
    message(STATUS "moh: could not tell which CUDA LibTorch was built with (no version.py / build-version); "
                   "make sure the CUDA toolkit's major version matches it")
  endif()
endif()
# A pip wheel's libtorch_cuda.so finds its CUDA libraries (cuDNN, NCCL, cuBLAS, ...) in the nvidia-* wheels next to
# it through its RPATH; the linker must resolve them there too, not in the system CUDA toolkit (whose NCCL, say, is
# older and lacks symbols the wheel uses).
if(TARGET torch_cuda)
  get_filename_component(_moh_site "${Torch_DIR}/../../../.." REALPATH)
  file(GLOB _moh_nvidia_libs LIST_DIRECTORIES true "${_moh_site}/nvidia/*/lib")
  foreach(_moh_dir ${_moh_nvidia_libs})
    set_property(TARGET torch APPEND PROPERTY INTERFACE_LINK_OPTIONS "LINKER:-rpath-link,${_moh_dir}")
  endforeach()
endif()

if(MOH_TORCH_CUDA_VERSION)
  message(STATUS "moh: LibTorch ${Torch_VERSION} (CUDA ${MOH_TORCH_CUDA_VERSION}) from ${Torch_DIR}")
else()
  message(STATUS "moh: LibTorch ${Torch_VERSION} from ${Torch_DIR}")
endif()
