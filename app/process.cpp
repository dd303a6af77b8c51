#include "app/process.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <cerrno>
#include <cstring>

extern char** environ;  // NOLINT: POSIX names it so

namespace ckptsim::app {

namespace {

// This process's environment with every NAME of `set` replaced (or added).
std::vector<std::string> child_environment(const std::vector<std::string>& set) {
  std::vector<std::string> env = set;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& s : set) replaced = replaced || s.substr(0, s.find('=')) == name;
    if (!replaced) env.push_back(entry);
  }
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Reads `fd` to its end, handing every line to on_line.
void read_lines(int fd, const std::function<void(const std::string&)>& on_line) {
  std::string pending;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buf, static_cast<size_t>(n));
    for (size_t nl = pending.find('\n'); nl != std::string::npos; nl = pending.find('\n')) {
      if (on_line) on_line(pending.substr(0, nl));
      pending.erase(0, nl + 1);
    }
  }
  if (!pending.empty() && on_line) on_line(pending);
}

Result<ProcessExit> wait_for(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return Status::io_error(std::string("waitpid: ") + std::strerror(errno));
  }
  ProcessExit e;
  if (WIFEXITED(status)) e.status = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
  return e;
}

}  // namespace

std::string ProcessExit::describe() const {
  return signal != 0 ? fmt::format("killed by signal {}", signal)
                     : fmt::format("exit status {}", status);
}

Result<ProcessExit> run_process(const ProcessOptions& o) {
  CKPTSIM_CHECK(!o.argv.empty(), "run_process without a program");
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return Status::io_error(std::string("pipe: ") + strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  std::vector<std::string> args = o.argv;
  std::vector<std::string> env = child_environment(o.env_set);
  std::vector<char*> c_args = c_strings(args);
  std::vector<char*> c_env = c_strings(env);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, c_args[0], &actions, nullptr, c_args.data(), c_env.data());
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return Status::not_found(fmt::format("cannot start {}: {}", o.argv[0], std::strerror(rc)));
  }
  read_lines(fds[0], o.on_line);
  close(fds[0]);
  return wait_for(pid);
}

}  // namespace ckptsim::app
