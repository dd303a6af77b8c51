// render_plot (report/plot.h): the files, and gnuplot as a subprocess.
#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "report/plot.h"

extern char** environ;

namespace ckptsim::report {

namespace {

namespace fs = std::filesystem;

Status write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  return out ? Status::ok() : Status::io_error(path.string() + ": cannot write");
}

// A gnuplot single-quoted string: a quote inside is written twice.
std::string single_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

// Runs `gnuplot -d plot.gp` in `dir`; what it prints comes back in the result.
GnuplotRun run_gnuplot(const std::string& program, const fs::path& dir) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return {GnuplotOutcome::kFailed, "cannot make a pipe"};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addchdir_np(&actions, dir.c_str());
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 2);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[1]);
  std::string arg0 = program;
  std::string arg1 = "-d";  // --default-settings: no ~/.gnuplot, no system gnuplotrc
  std::string arg2 = "plot.gp";
  char* argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, program.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  GnuplotRun run;
  if (spawned != 0) {
    close(pipe_fds[0]);
    return {spawned == ENOENT ? GnuplotOutcome::kMissing : GnuplotOutcome::kFailed,
            program + ": " + std::strerror(spawned)};
  }
  char buf[4096];
  for (ssize_t n; (n = read(pipe_fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    run.output.append(buf, static_cast<size_t>(n));
  }
  close(pipe_fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  // posix_spawnp reports a program that cannot be executed through the child's exit 127.
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127 && run.output.empty())
    return {GnuplotOutcome::kMissing, program + ": cannot be executed"};
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) run.outcome = GnuplotOutcome::kFailed;
  return run;
}

// A fresh folder next to the PNG (same file system, so the PNG moves by rename).
Result<fs::path> work_dir(const fs::path& png) {
  const fs::path parent = png.parent_path().empty() ? fs::path(".") : png.parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec)
    return Status::io_error(parent.string() + ": cannot create the directory: " + ec.message());
  std::string pattern = (parent / ("." + png.filename().string() + ".XXXXXX")).string();
  if (mkdtemp(pattern.data()) == nullptr)
    return Status::io_error(pattern + ": cannot create a folder: " + std::strerror(errno));
  return fs::path(pattern);
}

}  // namespace

Result<GnuplotRun> render_plot(const PlotSpec& spec, const PlotFiles& files) {
  const fs::path png(files.png);
  auto dir = work_dir(png);
  if (!dir.is_ok()) return dir.status();
  const std::string data = plot_data(spec);
  const std::string script = plot_script(spec);
  Status s = write_file(dir.value() / "plot.dat", data);
  if (s.is_ok()) s = write_file(dir.value() / "plot.gp", script);
  GnuplotRun run;
  if (s.is_ok()) run = run_gnuplot(files.gnuplot, dir.value());
  std::error_code ec;
  if (s.is_ok() && run.outcome == GnuplotOutcome::kOk) {
    fs::rename(dir.value() / "plot.png", png, ec);
    if (ec) s = Status::io_error(png.string() + ": cannot move the picture here: " + ec.message());
  }
  if (s.is_ok() && files.keep_data) {
    // The kept script names its neighbours, so that `gnuplot -d NAME.gp` redraws NAME.png.
    fs::path stem = png;
    stem.replace_extension();
    const std::string name = stem.filename().string();
    s = write_file(stem.string() + ".dat", data);
    if (s.is_ok()) {
      s = write_file(stem.string() + ".gp", "data = " + single_quoted(name + ".dat") + "\nout = " +
                                                single_quoted(name + ".png") + "\n" + script);
    }
  }
  fs::remove_all(dir.value(), ec);
  if (!s.is_ok()) return s;
  return run;
}

}  // namespace ckptsim::report
