#include "report/trace_file.h"

#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace ckptsim::report {

namespace {

constexpr const char* kPlain = ".trace.json";
constexpr const char* kGzip = ".trace.json.gz";

Result<std::string> gunzip_file(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return Status::not_found(path + ": cannot open");
  std::string out;
  char buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  int code = Z_OK;
  const char* what = gzerror(f, &code);
  const bool failed = n < 0 || (code != Z_OK && code != Z_STREAM_END);
  const std::string message = failed ? std::string(what) : "";
  gzclose(f);
  if (failed) return Status::invalid_input(path + ": not a readable gzip file: " + message);
  return out;
}

}  // namespace

bool is_trace_file(const std::string& path) {
  return path.ends_with(kPlain) || path.ends_with(kGzip);
}

std::string trace_stem(const std::string& path) {
  std::string stem = std::filesystem::path(path).filename().string();
  for (const char* ext : {kGzip, kPlain}) {
    const std::string e(ext);
    if (stem.ends_with(e)) return stem.substr(0, stem.size() - e.size());
  }
  return stem;
}

Result<nlohmann::json> read_trace_file(const std::string& path) {
  std::string text;
  if (path.ends_with(".gz")) {
    auto t = gunzip_file(path);
    if (!t.is_ok()) return t.status();
    text = std::move(t.value());
  } else {
    std::ifstream in(path, std::ios::binary);
    if (!in) return Status::not_found(path + ": cannot open");
    std::ostringstream s;
    s << in.rdbuf();
    text = s.str();
  }
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return Status::invalid_input(path + ": not valid JSON");
  return j;
}

}  // namespace ckptsim::report
