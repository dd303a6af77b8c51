// What check and gate share with their --real versions (app/real_commands.cpp): the helpers of
// app/commands.cpp that read the search flags and write a search's outputs. Internal to app/.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "app/commands.h"
#include "model/revision.h"
#include "model/status.h"
#include "report/search_report.h"
#include "search/gate.h"
#include "search/search.h"

namespace ckptsim::app::detail {

// "ckptsim: <message>" on err; kExitInvalid.
int invalid(std::ostream& err, const std::string& message);
// The embedded profiles and the --profile files.
Result<model::RevisionRegistry> load_registry(const std::vector<std::string>& profile_files);
Status write_json(const std::string& path, const nlohmann::json& j);
Status write_text(const std::string& path, const std::string& text);
// The search flags that differ from the defaults, as a repeat line writes them.
std::string search_repeat_flags(const SearchCommand& c);
// --jobs: 0 is every core.
int all_jobs(int jobs);
// The search options a command's flags give, revisions aside. Every flag's range is checked.
Result<search::SearchOptions> search_options(const SearchCommand& c);
// A revision flag's value must name a known profile (or a profile file).
Result<sim::Revision> revision_flag(model::RevisionRegistry& registry, const std::string& flag,
                                    const std::string& revision);
// Writes every failure's minimal scenario; the reported failures in order.
Result<std::vector<report::ReportedFailure>> write_failures(
    const SearchCommand& c, const std::vector<const search::Failure*>& failures,
    const std::vector<std::string>& hows, const std::vector<std::string>& tags);
// Each gate finding's minimal scenario written, with its class (search::gate_class_name).
Result<std::vector<report::ReportedFailure>> write_gate_findings(const SearchCommand& c,
                                                                 const search::GateResult& result,
                                                                 const std::string& repeat);
void say_gate_findings(const std::vector<report::ReportedFailure>& reported, std::ostream& out);
// What is checked before a search starts: where its outputs go, and the --megatron options.
Status prepare_search_outputs(const SearchCommand& c, const model::RevisionRegistry& registry);

struct GateNames {
  std::string baseline;
  std::string candidate;
  std::string repeat;
};
// gate-report.md and junit.xml in the gate's --out.
Status write_gate_files(const SearchCommand& c, const GateNames& n,
                        const search::GateResult& result,
                        const std::vector<report::ReportedFailure>& reported);

// What a check (or the merge of its shards) reports, besides its result: `whole` is the whole
// search's repeat line (the found scenarios' "how", the same in every shard), `repeat` the
// line that repeats this run.
struct CheckNames {
  std::string revision;
  std::string whole;
  std::string repeat;
  search::Shard shard;
  int jobs = 1;
};
// Called with the reported failures once their minimal scenarios are written, before anything
// else is: --real sets each one's real_code and puts its real trace beside it.
using Annotate = std::function<void(std::vector<report::ReportedFailure>&)>;
// The outputs of check and merge: the minimal scenarios, the JUnit file, the summary, and the
// console or JSON; the exit code.
int report_check(const SearchCommand& c, const CheckNames& n, const search::SearchResult& result,
                 model::RevisionRegistry& registry, std::ostream& out, std::ostream& err,
                 const Annotate& annotate = {});

}  // namespace ckptsim::app::detail
