# Writes the text of INPUT into OUTPUT as a C++ raw string constant NAME, for sources that hand
# a file's text to a run-time compiler (cmake -DINPUT=... -DOUTPUT=... -DNAME=... -P this file).
file(READ ${INPUT} text)
string(FIND "${text}" ")kiln_text\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT} holds the raw string's closing delimiter")
endif()
get_filename_component(source ${INPUT} NAME)
file(WRITE ${OUTPUT}.tmp "// Generated from ${source} by cmake/embed_text.cmake; do not edit.\n"
  "inline constexpr char ${NAME}[] = R\"kiln_text(${text})kiln_text\";\n")
file(COPY_FILE ${OUTPUT}.tmp ${OUTPUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUTPUT}.tmp)
