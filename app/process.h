// A child process whose output is read line by line: how ckptsim runs the replay runner
// (`python -m replay run`) for check/gate --megatron.
//
// Invariants:
//   1. The child gets /dev/null as stdin and one pipe as stdout and stderr; every line it writes
//      reaches `on_line` (without its newline), in order, the last one even without a newline.
//   2. run_process returns only after the child has exited (it never leaves a zombie) and never
//      throws: a child that cannot start is a Status naming the program and the reason.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/status.h"

namespace ckptsim::app {

struct ProcessOptions {
  std::vector<std::string> argv;     // argv[0] is looked up on PATH unless it holds a '/'
  std::vector<std::string> env_set;  // "NAME=VALUE": replaces NAME in this process's environment
  std::function<void(const std::string&)> on_line;  // each output line (may be empty)
};

struct ProcessExit {
  int status = -1;  // the exit status, or -1 when a signal ended the child
  int signal = 0;   // that signal (0: it exited)
  bool ok() const { return status == 0; }
  std::string describe() const;  // "exit status 3", "killed by signal 9"
};

// REQUIRES: !o.argv.empty().
Result<ProcessExit> run_process(const ProcessOptions& o);

// A child that lives across many requests (the real engine's `python -m replay serve`): its
// stdin and stdout are pipes for one-line messages, its stderr goes to a log file, and it leads
// a process group of its own, so that kill() ends it together with every process it started.
// Starting one makes this process ignore SIGPIPE: a write to a child that died returns false
// from send_line, it does not end ckptsim.
//
// Invariants:
//   3. The destructor kills the group (if still alive) and reaps the child: no zombie, no
//      orphaned grandchild that stayed in the group.
//   4. read_line never waits past its deadline: a child that hangs is a timeout, not a hang.
class Child {
 public:
  // Starts argv (looked up on PATH unless it holds a '/'), stderr appended to `log_path`.
  static Result<std::unique_ptr<Child>> start(const std::vector<std::string>& argv,
                                              const std::vector<std::string>& env_set,
                                              const std::string& log_path);
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  // Writes `line` and a newline to the child's stdin; false when the pipe is closed.
  bool send_line(const std::string& line);
  enum class Read { kLine, kTimeout, kEof };
  // The next line of its stdout (without the newline), waiting at most `timeout_s` seconds.
  Read read_line(double timeout_s, std::string& line);
  // SIGKILL to the whole group, then reaps the child. Idempotent.
  void kill();
  pid_t pid() const { return pid_; }
  // After kill() or EOF: how it ended ("exit status 0", "killed by signal 9").
  std::string describe_exit();

 private:
  Child() = default;
  pid_t pid_ = -1;
  int in_ = -1;   // its stdin
  int out_ = -1;  // its stdout
  std::string pending_;
  bool reaped_ = false;
  ProcessExit exit_;
};

}  // namespace ckptsim::app
