# cuDNN fused attention: finds cudnn-frontend's headers (header-only C++; the
# `nvidia-cudnn-frontend` wheel ships them in include/) and cuDNN's cudnn.h.
# cuDNN itself is not linked: csrc/ops/fused_attn/cudnn/cudnn_library.cpp dlopens
# it at the first fused attention call. Sets OPENTE_WITH_CUDNN,
# OPENTE_CUDNN_FRONTEND_DIR and OPENTE_CUDNN_HEADER_DIR.
#
# cudnn_frontend.h, first found:
#   -DOPENTE_CUDNN_FRONTEND_INCLUDE=DIR, or the environment variable of that name;
#   DIR/include of each PYTHONPATH entry (a wheel installed with pip --target DIR);
#   the Python environment's nvidia-cudnn-frontend (site-packages/include);
#   a wheel in the source tree's .whl/ (tools/fetch_cudnn_frontend.sh), unpacked
#   into the build folder.
# cudnn.h (cuDNN 9 or newer), first found:
#   -DOPENTE_CUDNN_INCLUDE=DIR, or the environment variable of that name;
#   the CUDA toolkit's include folder;
#   nvidia/cudnn/include of each PYTHONPATH entry or of the Python environment
#   (PyTorch's nvidia-cudnn-cu* wheel).

set(OPENTE_WITH_CUDNN OFF)
set(OPENTE_CUDNN_FRONTEND_DIR "")
set(OPENTE_CUDNN_HEADER_DIR "")

if(OPENTE_WITH_CUDA AND NOT OPENTE_CUDNN STREQUAL "OFF")
  if(Python_EXECUTABLE)
    set(_opente_py "${Python_EXECUTABLE}")
  else()
    find_program(_opente_py NAMES python3 python)
  endif()
  set(_opente_pythonpath "")
  if(DEFINED ENV{PYTHONPATH})
    string(REPLACE ":" ";" _opente_pythonpath "$ENV{PYTHONPATH}")
  endif()

  # ---- cudnn_frontend.h ----
  set(_fe_candidates "${OPENTE_CUDNN_FRONTEND_INCLUDE}" "$ENV{OPENTE_CUDNN_FRONTEND_INCLUDE}")
  foreach(_dir IN LISTS _opente_pythonpath)
    list(APPEND _fe_candidates "${_dir}/include")
  endforeach()
  if(_opente_py)
    # find_spec locates the package without importing it (importing needs its Python deps).
    execute_process(
      COMMAND "${_opente_py}" -c
        "import importlib.util as u, os\ns = u.find_spec('cudnn')\nfor p in (s.submodule_search_locations if s else []): print(os.path.join(os.path.dirname(p), 'include')); print(os.path.join(p, 'include'))"
      OUTPUT_VARIABLE _fe_py_dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    string(REPLACE "\n" ";" _fe_py_dirs "${_fe_py_dirs}")
    list(APPEND _fe_candidates ${_fe_py_dirs})
  endif()
  foreach(_dir IN LISTS _fe_candidates)
    if(_dir AND EXISTS "${_dir}/cudnn_frontend.h")
      set(OPENTE_CUDNN_FRONTEND_DIR "${_dir}")
      break()
    endif()
  endforeach()
  if(NOT OPENTE_CUDNN_FRONTEND_DIR)
    file(GLOB _fe_wheels "${CMAKE_SOURCE_DIR}/.whl/nvidia_cudnn_frontend-*.whl")
    if(_fe_wheels)
      list(GET _fe_wheels 0 _fe_wheel)
      set(_fe_unpacked "${CMAKE_BINARY_DIR}/cudnn_frontend_wheel")
      file(ARCHIVE_EXTRACT INPUT "${_fe_wheel}" DESTINATION "${_fe_unpacked}" PATTERNS "include/*")
      if(EXISTS "${_fe_unpacked}/include/cudnn_frontend.h")
        set(OPENTE_CUDNN_FRONTEND_DIR "${_fe_unpacked}/include")
      endif()
    endif()
  endif()

  # ---- cudnn.h ----
  set(_cudnn_candidates "${OPENTE_CUDNN_INCLUDE}" "$ENV{OPENTE_CUDNN_INCLUDE}" ${CUDAToolkit_INCLUDE_DIRS})
  foreach(_dir IN LISTS _opente_pythonpath)
    list(APPEND _cudnn_candidates "${_dir}/nvidia/cudnn/include")
  endforeach()
  if(_opente_py)
    execute_process(
      COMMAND "${_opente_py}" -c
        "import importlib.util as u, os\ns = u.find_spec('nvidia.cudnn')\nfor p in (s.submodule_search_locations if s else []): print(os.path.join(p, 'include'))"
      OUTPUT_VARIABLE _cudnn_py_dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    string(REPLACE "\n" ";" _cudnn_py_dirs "${_cudnn_py_dirs}")
    list(APPEND _cudnn_candidates ${_cudnn_py_dirs})
  endif()
  set(_cudnn_old "")
  foreach(_dir IN LISTS _cudnn_candidates)
    if(_dir AND EXISTS "${_dir}/cudnn.h" AND EXISTS "${_dir}/cudnn_version.h")
      file(STRINGS "${_dir}/cudnn_version.h" _major REGEX "^#define CUDNN_MAJOR [0-9]+")
      string(REGEX REPLACE "^#define CUDNN_MAJOR ([0-9]+).*" "\\1" _major "${_major}")
      if(_major GREATER_EQUAL 9)
        set(OPENTE_CUDNN_HEADER_DIR "${_dir}")
        break()
      endif()
      string(APPEND _cudnn_old " ${_dir} (cuDNN ${_major})")
    endif()
  endforeach()

  if(OPENTE_CUDNN_FRONTEND_DIR AND OPENTE_CUDNN_HEADER_DIR)
    set(OPENTE_WITH_CUDNN ON)
    message(STATUS "OpenTE: cuDNN fused attention ON (cudnn-frontend ${OPENTE_CUDNN_FRONTEND_DIR}, "
                   "cudnn.h ${OPENTE_CUDNN_HEADER_DIR}; libcudnn is loaded at run time)")
  else()
    set(_missing "")
    if(NOT OPENTE_CUDNN_FRONTEND_DIR)
      string(APPEND _missing " cudnn_frontend.h (run tools/fetch_cudnn_frontend.sh, pip install "
                             "nvidia-cudnn-frontend, or pass -DOPENTE_CUDNN_FRONTEND_INCLUDE=DIR);")
    endif()
    if(NOT OPENTE_CUDNN_HEADER_DIR)
      string(APPEND _missing " cudnn.h of cuDNN 9+ (pass -DOPENTE_CUDNN_INCLUDE=DIR)${_cudnn_old};")
    endif()
    if(OPENTE_CUDNN STREQUAL "ON")
      message(FATAL_ERROR "OPENTE_CUDNN=ON but not found:${_missing}")
    endif()
    message(STATUS "OpenTE: cuDNN fused attention OFF, not found:${_missing}")
  endif()
elseif(OPENTE_CUDNN STREQUAL "ON")
  message(FATAL_ERROR "OPENTE_CUDNN=ON needs the CUDA build (OPENTE_CUDA and nvcc)")
else()
  message(STATUS "OpenTE: cuDNN fused attention OFF")
endif()
