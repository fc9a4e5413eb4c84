// The format's specification lives in the reader's header (src/io/package/format.h) and in
// docs/package-format.md: they must say the same.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace {

std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(PackageSpec, DocsMatchTheReadersHeader) {
  const std::string header = read(KILN_SOURCE_DIR "/src/io/package/format.h");
  const std::string doc = read(KILN_SOURCE_DIR "/docs/package-format.md");
  ASSERT_FALSE(header.empty());
  ASSERT_FALSE(doc.empty());
  // the comment before #pragma once, without its "// "
  std::string spec;
  std::istringstream in(header);
  for (std::string line; std::getline(in, line) && line.rfind("#pragma", 0) != 0;)
    spec += (line.rfind("// ", 0) == 0 ? line.substr(3)
                                       : line.substr(std::min<size_t>(2, line.size()))) +
            "\n";
  while (!spec.empty() && spec[spec.size() - 2] == '\n') spec.pop_back();
  EXPECT_NE(doc.find("```text\n" + spec + "```"), std::string::npos)
      << "docs/package-format.md does not hold format.h's header comment verbatim";
}

}  // namespace
