// How one search uses several cores (`check --jobs N`): a pool of worker threads that judge
// scenarios, and an ordered view of their results, so that a search with N workers commits
// exactly what the sequential search commits, in the same order (search/search.h, invariant 5).
//
// WorkPool runs tasks on a fixed set of threads: urgent tasks (shrink candidates) before
// ordinary ones (cases judged ahead), each kind first in, first out. JudgedInOrder hands out
// the results of tasks 0, 1, 2, ... strictly in index order, starting task i + 1 ... i + ahead
// while the caller waits for task i; what a task threw is rethrown when its index is taken,
// never earlier (the sequential search would have thrown there too).
//
// Which of the submitted tasks a free worker starts is the JudgedInOrder's schedule. By default
// the lowest index not yet started. With DearFirst, the caller predicts every submitted task's
// cost (on its own thread, while the workers start in index order), and up to `lanes` workers at
// once start the dearest task not yet started instead, where its predicted cost is at least
// 1 / (4 x workers) of the whole run's predicted cost: a case that would outlast the rest of the
// run if it started in its turn starts early, and the other workers keep the index order. The
// schedule decides when a task runs, never what it computes nor the order results are taken in.
//
// Invariants:
//   1. With zero workers nothing runs on another thread: submit() runs the task at once on the
//      caller's thread, and JudgedInOrder runs task i only when i is taken. A search with
//      jobs = 1 is the plain sequential loop, and judges nothing it does not use.
//   2. Bounded: at most kWorkersMax threads; at most `ahead` tasks of one JudgedInOrder past the
//      one last taken are ever submitted.
//   3. A task that is still queued when its JudgedInOrder is destroyed never runs; one that is
//      running finishes into state it shares (shared_ptr), never into freed memory.
//   4. The pool's destructor (or shutdown()) drops queued tasks and joins every worker: what a
//      task refers to besides its shared state must outlive the pool.
//   5. Under DearFirst, at least workers - lanes workers (lanes <= workers / 2) run tasks in index
//      order whenever there are tasks to run: the oldest tasks are judged at no less than half
//      the rate of the plain index order, whatever the predictions say. A prediction is a hint:
//      a wrong one costs time, never a result.
#pragma once

#include <rapidcheck.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "search/search.h"

namespace ckptsim::search {

class WorkPool {
 public:
  static constexpr int kWorkersMax = SearchOptions::kJobsMax;

  // REQUIRES: 0 <= workers <= kWorkersMax.
  explicit WorkPool(int workers);
  ~WorkPool();
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  int workers() const { return static_cast<int>(threads_.size()); }
  // REQUIRES: `task` does not throw (the tasks of JudgedInOrder catch and keep what they throw).
  void submit(std::function<void()> task, bool urgent);
  // Drops the queued tasks and joins the workers; idempotent.
  void shutdown();

 private:
  void work();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> urgent_;
  std::deque<std::function<void()>> ordinary_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// One judged scenario: a case (drawn by the task, with its RapidCheck shrinkable) or a shrink
// candidate (given).
struct Judged {
  std::optional<rc::Shrinkable<sim::Scenario>> shrinkable;  // cases only
  sim::Scenario scenario;
  std::optional<Finding> finding;
  double seconds = 0;       // the judge's wall-clock time
  int64_t started_as = -1;  // JudgedInOrder: its task was the (started_as + 1)th to start
};

// The schedule that starts predicted-dear tasks early (invariant 5).
struct DearFirst {
  // Task i's predicted cost, in any unit (>= 0); called on the caller's thread, in index order.
  std::function<double(int64_t)> cost;
  // At most this many workers run tasks out of index order at once; 0: workers / 2.
  int lanes = 0;
};

class JudgedInOrder {
 public:
  // Task i: make(i). `runs` counts the tasks that started (judge runs made, used or not).
  // `dear_first`: the schedule of invariant 5 (none: index order).
  // REQUIRES: `make` and what it refers to outlive `pool`'s workers (WorkPool invariant 4).
  JudgedInOrder(WorkPool& pool, int64_t count, int64_t ahead, bool urgent,
                std::function<Judged(int64_t)> make, std::atomic<int64_t>& runs,
                std::optional<DearFirst> dear_first = std::nullopt);
  ~JudgedInOrder();
  JudgedInOrder(const JudgedInOrder&) = delete;
  JudgedInOrder& operator=(const JudgedInOrder&) = delete;

  // The result of task i; rethrows what it threw.
  // REQUIRES: i < count, and i greater than every index taken before.
  Judged take(int64_t i);

  // How many predicted costs the schedule holds (published to the workers); any thread.
  int64_t predictions_published() const;

 private:
  struct State;
  void submit_through(int64_t last);
  // Predicts the cost of every submitted task not yet predicted (DearFirst).
  void predict_submitted();

  WorkPool& pool_;
  const int64_t count_;
  const int64_t ahead_;
  const bool urgent_;
  std::shared_ptr<State> state_;
  int64_t submitted_ = 0;                // tasks 0 .. submitted_ - 1 are submitted
  std::function<double(int64_t)> cost_;  // DearFirst::cost; empty: index order
  int64_t predicted_ = 0;                // tasks 0 .. predicted_ - 1 have a predicted cost
};

}  // namespace ckptsim::search
