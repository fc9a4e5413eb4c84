// `kiln launch -n N -- PROGRAM ARGS...`: starts N ranks of a data-parallel program on this machine
// (one per GPU for NCCL), the way mpirun does for MPI programs. Each rank gets KILN_RANK,
// KILN_WORLD_SIZE, KILN_LOCAL_RANK and KILN_RENDEZVOUS=file:DIR (a fresh folder, removed at the
// end) in its environment; kiln::dist::launch_info() reads them. When a rank fails, the others
// are stopped (SIGTERM, then SIGKILL after a grace period) and launch exits with its status.
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <thread>

#include "kiln/error.h"
#include "tools/kiln/commands.h"

namespace kiln::cli {

namespace {
struct LaunchOptions {
  int nproc = 1;
  double grace = 5;
  std::vector<std::string> command;
};

int exit_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string describe(int status) {
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {}", WTERMSIG(status));
  return fmt::format("exited with status {}", WEXITSTATUS(status));
}

volatile std::sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }

// Throws IoError unless `program` names an executable file, as execvp would find it (through
// PATH when it has no '/'), so that a typo is one error line rather than a failed rank per rank.
void check_program(const std::string& program) {
  auto runnable = [](const std::string& path) {
    std::error_code ec;
    return std::filesystem::is_regular_file(path, ec) && ::access(path.c_str(), X_OK) == 0;
  };
  if (program.find('/') != std::string::npos) {
    if (!runnable(program))
      throw IoError(fmt::format("[launch] cannot run '{}': not an executable file", program));
    return;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  for (size_t start = 0; start <= dirs.size();) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = end > start ? dirs.substr(start, end - start) : ".";
    if (runnable(dir + "/" + program)) return;
    start = end + 1;
  }
  throw IoError(fmt::format("[launch] cannot run '{}': no such program in PATH", program));
}

int launch(const LaunchOptions& o) {
  if (o.command.empty()) throw ValueError("[launch] no program given (kiln launch -n 2 -- PROGRAM ARGS)");
  check_program(o.command[0]);
  char pattern[] = "/tmp/kiln-rendezvous-XXXXXX";
  if (!::mkdtemp(pattern)) throw IoError("[launch] cannot create a rendezvous folder in /tmp");
  const std::string dir = pattern;
  std::map<pid_t, int> ranks;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  for (int r = 0; r < o.nproc; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) throw Error(fmt::format("[launch] fork failed for rank {}", r));
    if (pid == 0) {
      ::setpgid(0, 0);  // a group per rank: stopping a rank stops what it started
      ::setenv("KILN_RANK", std::to_string(r).c_str(), 1);
      ::setenv("KILN_LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("KILN_WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
      ::setenv("KILN_RENDEZVOUS", ("file:" + dir).c_str(), 1);
      std::vector<char*> argv;
      for (const auto& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execvp(argv[0], argv.data());
      std::fprintf(stderr, "[launch] cannot run %s: %s\n", argv[0], std::strerror(errno));
      std::_Exit(127);
    }
    ::setpgid(pid, pid);
    ranks[pid] = r;
  }
  int result = 0;
  bool stopping = false;
  auto deadline = std::chrono::steady_clock::time_point::max();
  while (!ranks.empty()) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      const int rank = ranks[pid];
      ranks.erase(pid);
      if (exit_status(status) != 0 && !stopping) {
        result = exit_status(status);
        std::fprintf(stderr, "[launch] rank %d %s; stopping the other %zu rank(s)\n", rank,
                     describe(status).c_str(), ranks.size());
        for (auto& [p, _] : ranks) ::kill(-p, SIGTERM);
        stopping = true;
        deadline = std::chrono::steady_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(o.grace * 1000));
      }
      continue;
    }
    if (pid < 0 && errno != EINTR) break;
    if (g_signal && !stopping) {  // launch itself was asked to stop: so are the ranks
      std::fprintf(stderr, "[launch] signal %d: stopping the ranks\n", static_cast<int>(g_signal));
      for (auto& [p, _] : ranks) ::kill(-p, SIGTERM);
      stopping = true;
      result = 128 + g_signal;
      deadline = std::chrono::steady_clock::now() +
                 std::chrono::milliseconds(static_cast<int64_t>(o.grace * 1000));
    }
    if (stopping && std::chrono::steady_clock::now() > deadline) {
      for (auto& [p, _] : ranks) ::kill(-p, SIGKILL);
      deadline = std::chrono::steady_clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return result;
}
}  // namespace

void add_launch_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "launch", "Start N ranks of a data-parallel program on this machine (one per GPU)");
  static LaunchOptions opts;
  cmd->add_option("-n,--nproc", opts.nproc, "Number of ranks")->check(CLI::Range(1, 1024));
  cmd->add_option("--grace", opts.grace,
                  "Seconds the other ranks get to stop after one fails before SIGKILL");
  cmd->add_option("command", opts.command, "The program and its arguments (after --)")
      ->required();
  cmd->callback([] {
    const int rc = launch(opts);
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace kiln::cli
