// The trace checks of the properties a trace can judge (properties/trace_checks.cpp), for the
// registry (properties/properties.cpp). Internal to properties/: every other layer reaches them
// through Property::trace_check or properties::judge_trace.
//
// Each is pure and never throws; a failing verdict names the run it was seen in and a signature
// (property:cause) that does not change with the scenario's sizes, as a run check's does.
#pragma once

#include "properties/properties.h"
#include "properties/trace.h"

namespace ckptsim::properties {

// no primary error with a merge() key path in a run that loads
TraceVerdict trace_no_duplicate_leaves(const trace::Trace& t);
// no primary error in any run
TraceVerdict trace_resume_completes(const trace::Trace& t);
// every resumed part's counter after the load, and the t it then uses, equal the reference
// run's for the shard holding the same first element (a missing counter counts as 0)
TraceVerdict trace_step_matches_uninterrupted(const trace::Trace& t);
// every part's counter after a load at global step g, and after step g, is g, and each step
// uses t = g (a missing counter counts as 0): in every run, the reference run's too
TraceVerdict trace_step_counts_optimizer_steps(const trace::Trace& t);
// the model params after every load and step hash equal to the reference run's at that global
// step (bitwise only: a trace carries hashes, not values)
TraceVerdict trace_trajectory_matches_uninterrupted(const trace::Trace& t);
// after a load the model params hash equal to what the previous run saved, and every counter
// equals the saved one
TraceVerdict trace_round_trip_identity(const trace::Trace& t);
// every param group's lr and weight decay at every step (rank 0's) equal the schedule in force
// (the scenario's: not evaluated where the trace's `spec` is unknown; properties/schedule.cpp)
TraceVerdict trace_hyperparams_follow_schedule(const trace::Trace& t);
// no part shares its step tensor (where a trace says)
TraceVerdict trace_step_tensors_not_aliased(const trace::Trace& t);
// every load left no requested range unwritten, on any rank (its after_load events' `unwritten`:
// not evaluated where no load of the trace was probed)
TraceVerdict trace_load_writes_every_element(const trace::Trace& t);
// every part of a resumed run that records state_dtypes stores them as the reference run's part
// holding the same first element at that global step (properties/state_dtypes.cpp)
TraceVerdict trace_state_dtypes_survive_resume(const trace::Trace& t);

}  // namespace ckptsim::properties
