// A child process whose output is read line by line: how ckptsim runs the replay runner
// (`python -m replay run`) for check/gate --megatron.
//
// Invariants:
//   1. The child gets /dev/null as stdin and one pipe as stdout and stderr; every line it writes
//      reaches `on_line` (without its newline), in order, the last one even without a newline.
//   2. run_process returns only after the child has exited (it never leaves a zombie) and never
//      throws: a child that cannot start is a Status naming the program and the reason.
#pragma once

#include <functional>
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

}  // namespace ckptsim::app
