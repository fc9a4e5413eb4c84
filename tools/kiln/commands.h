// Subcommands of the kiln CLI.
#pragma once

#include <CLI/CLI.hpp>

namespace kiln::cli {

void add_ops_command(CLI::App& app);
void add_demo_command(CLI::App& app);
void add_run_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_convert_command(CLI::App& app);
void add_launch_command(CLI::App& app);
void add_profile_command(CLI::App& app);
void add_quantize_command(CLI::App& app);
void add_generate_command(CLI::App& app);

}  // namespace kiln::cli
