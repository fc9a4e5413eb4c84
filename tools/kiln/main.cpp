// kiln: the command-line tool.
#include <cstdio>

#include "kiln/error.h"
#include "kiln/version.h"
#include "tools/kiln/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"kiln: build, compile and run machine-learning compute graphs"};
  app.require_subcommand(0, 1);
  bool show_version = false;
  app.add_flag("--version", show_version, "Print the version and exit");
  kiln::cli::add_ops_command(app);
  kiln::cli::add_demo_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
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
