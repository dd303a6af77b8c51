// JUnit XML, for CI systems that show test results: one <testcase> per property (check) or
// per finding (gate).
#pragma once

#include <string>
#include <vector>

namespace ckptsim::report {

struct JunitCase {
  std::string classname;
  std::string name;
  bool failed = false;
  std::string message;
  std::string text;
  std::string system_out;  // written as the case's <system-out> when not empty
};

// One <testsuite> named `suite` inside <testsuites>; every attribute and text XML-escaped.
// A case's <failure> (when failed) comes before its <system-out> (when any), as the JUnit schema
// orders them.
std::string junit_xml(const std::string& suite, const std::vector<JunitCase>& cases);

}  // namespace ckptsim::report
