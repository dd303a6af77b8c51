// search::draw and search::case_size: what `ckptsim generate` writes. A few cases must be drawn
// as many are: the generators scale their ranges by the RapidCheck size, and check's ramp
// (case k at size k % 101) gives the first dozen cases sizes 0 to 11, which draw DP 1 nearly
// always. Mutations these tests catch: the spread schedule giving the ramp's sizes
// (SizesOfAFewCasesSpreadOverTheRange), or any schedule under which 12 cases draw other shares
// of DP sizes or reshard classes than 500 do (TwelveCasesDrawTheSharesOfFiveHundred).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "search/search.h"
#include "tests/testing.h"

using namespace ckptsim;

namespace {

search::SearchOptions generate_options(bool campaign, search::SizeSchedule sizes, int64_t cases,
                                       uint64_t seed) {
  search::SearchOptions o;
  o.generator.revisions = test::revisions({"upstream-2874"});
  o.generator.campaign = campaign;
  o.generator.long_steps_max = 4096;  // the CLI's default
  if (campaign) {
    o.generator.dp_max = search::kCampaignDpMax;
    o.generator.params_max = search::kCampaignParamsMax;
  }
  o.sizes = sizes;
  o.cases = cases;
  o.seed = seed;
  return o;
}

search::Coverage coverage_of(const search::SearchOptions& o) {
  search::Coverage c;
  for (const auto& s : search::draw(o)) c.add(s);
  return c;
}

// The largest distance from one value of a feature's share among `few` to its share among
// `many`, in standard errors of a share among as many draws as `few` has (the share `many`
// gives taken for the true one), with 1/n of slack for the rounding of a share of n.
struct Gap {
  std::string value;
  double errors = 0;
};
Gap largest_gap(const search::Coverage& few, const search::Coverage& many,
                const std::string& feature) {
  auto total = [&](const search::Coverage& c) {
    int64_t n = 0;
    for (const auto& [_, count] : c.counts().at(feature)) n += count;
    return static_cast<double>(n);
  };
  const double n_few = total(few);
  const double n_many = total(many);
  Gap out;
  for (const auto& [value, count] : many.counts().at(feature)) {
    const double p = static_cast<double>(count) / n_many;
    const double q = static_cast<double>(few.count(feature, value)) / n_few;
    const double se = std::sqrt(p * (1 - p) / n_few);
    const double errors = std::max(0.0, std::abs(q - p) - 1 / n_few) / se;
    if (errors > out.errors) out = {value, errors};
  }
  return out;
}

}  // namespace

// The first n cases' sizes leave no gap in [0, size_max] much wider than (size_max + 1) / n:
// the golden-ratio sequence's gaps are at most phi^2 / n of the range (three-distance
// theorem), plus one for the rounding down to a size. 500 cases draw every size. The ramp
// leaves 12 cases at sizes 0 to 11 (a gap of 89), a fixed size at one size.
TEST(Draw, SizesOfAFewCasesSpreadOverTheRange) {
  for (uint64_t seed : {1, 2, 7, 31, 1000}) {
    for (int64_t n : {3, 12, 40, 101, 500}) {
      search::SearchOptions o;
      o.seed = seed;
      o.sizes = search::SizeSchedule::kSpread;
      std::vector<int> sizes;
      for (int64_t k = 0; k < n; ++k) sizes.push_back(search::case_size(o, k));
      std::sort(sizes.begin(), sizes.end());
      int gap = std::max(sizes.front(), o.size_max - sizes.back());
      for (size_t i = 1; i < sizes.size(); ++i) gap = std::max(gap, sizes[i] - sizes[i - 1]);
      const double bound = 2.62 * (o.size_max + 1) / static_cast<double>(n) + 1;
      EXPECT_LE(gap, bound) << "seed " << seed << ", " << n << " cases";
      if (n == 500) {
        EXPECT_EQ(std::unique(sizes.begin(), sizes.end()) - sizes.begin(), 101);
      }
    }
  }
  search::SearchOptions o;
  o.sizes = search::SizeSchedule::kFixed;
  o.fixed_size = 37;
  EXPECT_EQ(search::case_size(o, 0), 37);
  EXPECT_EQ(search::case_size(o, 12345), 37);
  o.sizes = search::SizeSchedule::kRamp;
  EXPECT_EQ(search::case_size(o, 11), 11);
  EXPECT_EQ(search::case_size(o, 101), 0);
}

// Case k is the same case whatever the number of cases drawn: the first 12 of 500 are the 12.
TEST(Draw, CaseKDoesNotDependOnHowManyCasesAreDrawn) {
  for (bool campaign : {false, true}) {
    const auto few = search::draw(generate_options(campaign, search::SizeSchedule::kSpread, 12, 3));
    const auto many =
        search::draw(generate_options(campaign, search::SizeSchedule::kSpread, 60, 3));
    ASSERT_EQ(few.size(), 12u);
    for (size_t k = 0; k < few.size(); ++k)
      EXPECT_EQ(sim::scenario_to_json(few[k]), sim::scenario_to_json(many[k])) << "case " << k;
  }
}

// `generate --cases 12` draws the shares of DP sizes, reshard classes and DP-1-throughout
// scenarios that `--cases 500` draws, for both profiles at generate's sizes (spread). Two
// bounds: each seed's 12 cases within 4 standard errors of its 500 (the noise of one small
// campaign), and the first 12 cases of ten seeds together within 3 of their 500s together
// (bias: what the first cases of any seed draw). Under check's ramp the first 12 cases are
// the smallest, and the pooled share of DP 1 is far outside (about 18 standard errors): the
// bound can fail, and does on the ramp.
TEST(Draw, TwelveCasesDrawTheSharesOfFiveHundred) {
  const std::vector<std::string> features = {"phases: DP", "resumes: reshard", "cases: DP"};
  auto pooled_gap = [&](bool campaign, search::SizeSchedule sizes) {
    search::Coverage few, many;
    double worst_seed = 0;
    for (uint64_t seed = 1; seed <= 10; ++seed) {
      const auto f = coverage_of(generate_options(campaign, sizes, 12, seed));
      const auto m = coverage_of(generate_options(campaign, sizes, 500, seed));
      for (const auto& feature : features)
        worst_seed = std::max(worst_seed, largest_gap(f, m, feature).errors);
      few.merge(f);
      many.merge(m);
    }
    Gap worst;
    for (const auto& feature : features) {
      const Gap g = largest_gap(few, many, feature);
      if (g.errors > worst.errors) worst = {feature + ": " + g.value, g.errors};
    }
    return std::make_pair(worst, worst_seed);
  };
  for (bool campaign : {false, true}) {
    const auto [pooled, one_seed] = pooled_gap(campaign, search::SizeSchedule::kSpread);
    EXPECT_LE(pooled.errors, 3.0) << (campaign ? "campaign: " : "search: ") << pooled.value;
    EXPECT_LE(one_seed, 4.0) << (campaign ? "campaign" : "search");
  }
  const auto [ramp, _] = pooled_gap(false, search::SizeSchedule::kRamp);
  EXPECT_GT(ramp.errors, 3.0) << ramp.value;
}

// --tp-max 4 --pp-max 4: every drawn scenario keeps the TP/PP rules (sim::model_parallel_problem),
// every param's dims are multiples of 4, a resume changes TP or PP only where the checkpoint it
// loads is model space (a bucket-space one is refused by design), and such resumes are drawn,
// with TP and PP of 2 and 4 both. Without the flags nothing of TP or PP is drawn.
// Mutations caught: the model-space rule dropped (bucket-space resumes changing TP counted);
// dims not rounded to multiples of 4 (TP 4 not dividing a split dim: a problem).
TEST(Draw, ModelParallelKeepsTheRules) {
  search::SearchOptions o = generate_options(false, search::SizeSchedule::kSpread, 300, 5);
  o.generator.tp_max = 4;
  o.generator.pp_max = 4;
  int changes = 0, tp4 = 0, pp4 = 0;
  for (const sim::Scenario& s : search::draw(o)) {
    const auto problem = sim::model_parallel_problem(s);
    EXPECT_FALSE(problem.has_value()) << (problem ? problem->first + ": " + problem->second : "");
    for (const auto& p : s.params) {
      ASSERT_EQ(p.shape.size(), 2u);
      EXPECT_EQ(p.shape[0] % 4 + p.shape[1] % 4, 0) << p.name;
    }
    for (size_t i = 0; i < s.phases.size(); ++i) {
      tp4 += s.phases[i].tp == 4 ? 1 : 0;
      pp4 += s.phases[i].pp == 4 ? 1 : 0;
      if (i == 0 || (s.phases[i].tp == s.phases[i - 1].tp && s.phases[i].pp == s.phases[i - 1].pp))
        continue;
      ++changes;
      EXPECT_TRUE(model::fully_reshardable_format(s.format_of(i - 1).sharding_type))
          << "phase " << i << " changes TP/PP loading " << sim::scenario_to_json(s).dump();
    }
  }
  EXPECT_GT(changes, 10);
  EXPECT_GT(tp4, 10);
  EXPECT_GT(pp4, 10);
  for (const sim::Scenario& s :
       search::draw(generate_options(false, search::SizeSchedule::kSpread, 50, 5))) {
    for (const auto& p : s.params) EXPECT_TRUE(p.shape.empty());
    for (const auto& ph : s.phases) EXPECT_EQ(ph.tp * ph.pp, 1);
  }
}
