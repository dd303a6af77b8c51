#include "report/junit.h"

#include <fmt/format.h>

namespace ckptsim::report {

namespace {

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

}  // namespace

std::string junit_xml(const std::string& suite, const std::vector<JunitCase>& cases) {
  int failures = 0;
  for (const auto& c : cases) failures += c.failed ? 1 : 0;
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += fmt::format("<testsuites tests=\"{}\" failures=\"{}\">\n", cases.size(), failures);
  out += fmt::format("  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\">\n", xml_escape(suite),
                     cases.size(), failures);
  for (const auto& c : cases) {
    out += fmt::format("    <testcase classname=\"{}\" name=\"{}\"", xml_escape(c.classname),
                       xml_escape(c.name));
    if (!c.failed && c.system_out.empty()) {
      out += "/>\n";
      continue;
    }
    out += ">\n";
    if (c.failed) {
      out += fmt::format("      <failure message=\"{}\">{}</failure>\n", xml_escape(c.message),
                         xml_escape(c.text));
    }
    if (!c.system_out.empty())
      out += fmt::format("      <system-out>{}</system-out>\n", xml_escape(c.system_out));
    out += "    </testcase>\n";
  }
  out += "  </testsuite>\n</testsuites>\n";
  return out;
}

}  // namespace ckptsim::report
