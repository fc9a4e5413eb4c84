# Core ML import (src/io/coreml, include/kiln/coreml.h): the Core ML specification's protobuf
# classes, generated at configure and build time from the schema that the coremltools package
# (PyPI, installed into .venv by scripts/setup.sh) carries inside its generated Python modules
# (scripts/coreml_descriptors.py writes it out as a descriptor set for protoc). The generated
# sources join the kiln library; only the importer's files see their headers.
# KILN_COREML=OFF builds without it: kiln::coreml::import then raises UnsupportedError.
option(KILN_COREML "Import Core ML models (needs the coremltools Python package while building)" ON)
if(NOT KILN_COREML)
  return()
endif()

set(KILN_COREML_PYTHON "" CACHE FILEPATH
    "Python that has the coremltools package (default: .venv/bin/python, else python3)")
set(_kiln_coreml_python ${KILN_COREML_PYTHON})
if(NOT _kiln_coreml_python)
  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/.venv/bin/python)
    set(_kiln_coreml_python ${CMAKE_CURRENT_SOURCE_DIR}/.venv/bin/python)
  else()
    find_program(_kiln_coreml_python python3 REQUIRED)
  endif()
endif()

set(KILN_COREML_GEN_DIR ${CMAKE_CURRENT_BINARY_DIR}/generated/coreml)
file(MAKE_DIRECTORY ${KILN_COREML_GEN_DIR})
set(_kiln_coreml_set ${KILN_COREML_GEN_DIR}/coreml_spec.pb)
execute_process(
  COMMAND ${_kiln_coreml_python} ${CMAKE_CURRENT_SOURCE_DIR}/scripts/coreml_descriptors.py
          ${_kiln_coreml_set} --list
  OUTPUT_VARIABLE _kiln_coreml_protos
  ERROR_VARIABLE _kiln_coreml_error
  RESULT_VARIABLE _kiln_coreml_rc)
if(NOT _kiln_coreml_rc EQUAL 0)
  message(FATAL_ERROR "Core ML import needs the coremltools package in ${_kiln_coreml_python}: "
          "${_kiln_coreml_error}Run scripts/setup.sh, set KILN_COREML_PYTHON to a Python that "
          "has it, or configure with -DKILN_COREML=OFF.")
endif()
string(STRIP "${_kiln_coreml_protos}" _kiln_coreml_protos)
string(REPLACE "\n" ";" _kiln_coreml_protos "${_kiln_coreml_protos}")

set(_kiln_coreml_sources "")
set(_kiln_coreml_headers "")
foreach(proto ${_kiln_coreml_protos})
  string(REGEX REPLACE "\\.proto$" "" stem ${proto})
  list(APPEND _kiln_coreml_sources ${KILN_COREML_GEN_DIR}/${stem}.pb.cc)
  list(APPEND _kiln_coreml_headers ${KILN_COREML_GEN_DIR}/${stem}.pb.h)
endforeach()
add_custom_command(
  OUTPUT ${_kiln_coreml_sources} ${_kiln_coreml_headers}
  COMMAND protobuf::protoc --descriptor_set_in=${_kiln_coreml_set} --cpp_out=${KILN_COREML_GEN_DIR}
          ${_kiln_coreml_protos}
  DEPENDS ${_kiln_coreml_set}
  COMMENT "protoc: the Core ML specification (${_kiln_coreml_set})")

file(GLOB KILN_COREML_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/io/coreml/*.cpp)
target_sources(kiln PRIVATE ${_kiln_coreml_sources} ${KILN_COREML_SOURCES})
# generated code: no warnings of ours
set_source_files_properties(${_kiln_coreml_sources} PROPERTIES COMPILE_OPTIONS -w
  INCLUDE_DIRECTORIES ${KILN_COREML_GEN_DIR})
set_source_files_properties(${KILN_COREML_SOURCES} PROPERTIES
  INCLUDE_DIRECTORIES ${KILN_COREML_GEN_DIR} OBJECT_DEPENDS "${_kiln_coreml_headers}")
# (only the stub that stands in without it asks; the library's other files keep their flags)
set_source_files_properties(${CMAKE_CURRENT_SOURCE_DIR}/src/io/coreml_disabled.cpp PROPERTIES
  COMPILE_DEFINITIONS KILN_HAS_COREML=1)
