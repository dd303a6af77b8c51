#include "app/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>

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

Result<std::unique_ptr<Child>> Child::start(const std::vector<std::string>& argv,
                                            const std::vector<std::string>& env_set,
                                            const std::string& log_path) {
  CKPTSIM_CHECK(!argv.empty(), "Child::start without a program");
  // A child that died with its stdin open must not take this process with it: a write to that
  // pipe then fails with EPIPE (send_line returns false) instead of raising SIGPIPE.
  static std::once_flag ignore_sigpipe;
  std::call_once(ignore_sigpipe, [] { ::signal(SIGPIPE, SIG_IGN); });
  int to_child[2];
  int from_child[2];
  if (pipe2(to_child, O_CLOEXEC) != 0)
    return Status::io_error(std::string("pipe: ") + strerror(errno));
  if (pipe2(from_child, O_CLOEXEC) != 0) {
    close(to_child[0]);
    close(to_child[1]);
    return Status::io_error(std::string("pipe: ") + strerror(errno));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
  posix_spawn_file_actions_addopen(&actions, 2, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                   0644);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);  // a group of its own, led by the child
  std::vector<std::string> args = argv;
  std::vector<std::string> env = child_environment(env_set);
  std::vector<char*> c_args = c_strings(args);
  std::vector<char*> c_env = c_strings(env);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, c_args[0], &actions, &attr, c_args.data(), c_env.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(to_child[0]);
  close(from_child[1]);
  if (rc != 0) {
    close(to_child[1]);
    close(from_child[0]);
    return Status::not_found(fmt::format("cannot start {}: {}", argv[0], std::strerror(rc)));
  }
  std::unique_ptr<Child> c(new Child());
  c->pid_ = pid;
  c->in_ = to_child[1];
  c->out_ = from_child[0];
  return c;
}

Child::~Child() {
  kill();
  if (in_ >= 0) close(in_);
  if (out_ >= 0) close(out_);
}

bool Child::send_line(const std::string& line) {
  if (in_ < 0) return false;
  const std::string text = line + "\n";
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(in_, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

Child::Read Child::read_line(double timeout_s, std::string& line) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::duration<double>(std::max(0.0, timeout_s));
  for (;;) {
    if (const size_t nl = pending_.find('\n'); nl != std::string::npos) {
      line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      return Read::kLine;
    }
    if (out_ < 0) return Read::kEof;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
    if (left.count() <= 0) return Read::kTimeout;
    pollfd p{out_, POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1'000'000)));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) continue;  // the deadline is checked above
    char buf[65536];
    const ssize_t n = read(out_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(out_);
      out_ = -1;
      if (!pending_.empty()) {
        line = pending_;
        pending_.clear();
        return Read::kLine;
      }
      return Read::kEof;
    }
    pending_.append(buf, static_cast<size_t>(n));
  }
}

void Child::kill() {
  if (pid_ <= 0 || reaped_) return;
  ::kill(-pid_, SIGKILL);  // the group: the child and what it started
  ::kill(pid_, SIGKILL);
  auto e = wait_for(pid_);
  if (e.is_ok()) exit_ = e.value();
  reaped_ = true;
}

std::string Child::describe_exit() {
  if (!reaped_ && pid_ > 0) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      if (WIFEXITED(status)) exit_.status = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) exit_.signal = WTERMSIG(status);
    } else {
      return "still running";
    }
  }
  return exit_.describe();
}

}  // namespace ckptsim::app
