# Custom-op libraries (include/kiln/custom_op.h, docs/custom_ops.md).
#
# kiln_add_op_library(name sources...)
#   A shared library of custom ops for kiln::load_op_library. It links no kiln: it resolves
#   kiln's symbols from the program that loads it, so the process holds one op registry. Its .cu
#   sources use the shared CUDA runtime (a static one keeps its symbols hidden); their kernels
#   run on the cudaStream_t kiln hands them, in the device's primary context like kiln's own.
# kiln_enable_op_libraries(target)
#   Lets an executable load op libraries: links all of kiln (a static libkiln keeps only what the
#   program itself uses otherwise) and exports its symbols to them.

function(kiln_add_op_library name)
  add_library(${name} MODULE ${ARGN})
  target_include_directories(${name} PRIVATE
    $<TARGET_PROPERTY:kiln::kiln,INTERFACE_INCLUDE_DIRECTORIES>)
  target_compile_features(${name} PRIVATE cxx_std_20)
  set_target_properties(${name} PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
endfunction()

function(kiln_enable_op_libraries target)
  set_target_properties(${target} PROPERTIES ENABLE_EXPORTS ON)
  get_target_property(_type kiln::kiln TYPE)
  if(_type STREQUAL "STATIC_LIBRARY")
    target_link_options(${target} PRIVATE
      "LINKER:--whole-archive,$<TARGET_FILE:kiln::kiln>,--no-whole-archive")
  endif()
  target_link_libraries(${target} PRIVATE kiln::kiln)
endfunction()
