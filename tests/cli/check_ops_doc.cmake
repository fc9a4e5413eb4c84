# Fails when docs/ops.md differs from `kiln ops --markdown` (regenerate with `make docs`).
execute_process(COMMAND ${KILN} ops --markdown OUTPUT_VARIABLE generated RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kiln ops --markdown failed: ${rc}")
endif()
file(READ ${DOC} current)
if(NOT generated STREQUAL current)
  message(FATAL_ERROR "docs/ops.md is stale: run `make docs` (or `build/kiln ops --markdown > docs/ops.md`)")
endif()
