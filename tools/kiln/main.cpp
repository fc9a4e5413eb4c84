// kiln: the command-line tool.
#include <cstdio>
#include <exception>
#include <new>
#include <sstream>
#include <string>

#include "kiln/error.h"
#include "kiln/version.h"
#include "tools/kiln/commands.h"

namespace {
// Errors are one line on stderr: "error: [component] ..." (the lines of a longer message are
// joined; messages without a component, from the option parser or the standard library, get
// "[kiln COMMAND]").
int fail(const std::string& message, const std::string& command) {
  std::string line, part;
  std::istringstream lines(message);
  while (std::getline(lines, part)) {
    part.erase(0, part.find_first_not_of(" \t"));
    if (part.empty()) continue;
    if (!line.empty()) line += line.back() == ':' ? " " : "; ";
    line += part;
  }
  if (line.empty() || line[0] != '[') line = "[" + command + "] " + line;
  std::fprintf(stderr, "error: %s\n", line.c_str());
  return 1;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln: build, compile and run machine-learning compute graphs"};
  app.require_subcommand(0, 1);
  bool show_version = false;
  app.add_flag("--version", show_version, "Print the version and exit");
  kiln::cli::add_ops_command(app);
  kiln::cli::add_demo_command(app);
  kiln::cli::add_run_command(app);
  kiln::cli::add_inspect_command(app);
  kiln::cli::add_bench_command(app);
  kiln::cli::add_convert_command(app);
  kiln::cli::add_launch_command(app);
  kiln::cli::add_profile_command(app);
  kiln::cli::add_quantize_command(app);
  kiln::cli::add_generate_command(app);
  // the command named on the line, for messages that do not name their component
  std::string command = "kiln";
  for (int i = 1; i < argc; ++i)
    if (const std::string a = argv[i];
        !app.get_subcommands([&](CLI::App* c) { return c->check_name(a); }).empty()) {
      command += " " + a;
      break;
    }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    return fail(e.what(), command);
  } catch (const std::bad_alloc&) {
    return fail("out of memory", command);
  } catch (const std::exception& e) {  // kiln::Error and anything else
    return fail(e.what(), command);
  }
  if (show_version) {
    std::printf("kiln %s\n", kiln::version());
    return 0;
  }
  if (app.get_subcommands().empty()) {
    std::printf("%s", app.help().c_str());
  }
  return 0;
}
