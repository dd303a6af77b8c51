#include "search/parallel.h"

#include <algorithm>
#include <map>
#include <queue>

#include "model/errors.h"

namespace ckptsim::search {

WorkPool::WorkPool(int workers) {
  CKPTSIM_CHECK(workers >= 0 && workers <= kWorkersMax, "WorkPool: workers out of range");
  threads_.reserve(static_cast<size_t>(workers));
  for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
}

WorkPool::~WorkPool() { shutdown(); }

void WorkPool::submit(std::function<void()> task, bool urgent) {
  if (threads_.empty()) {
    task();
    return;
  }
  {
    std::lock_guard lock(mu_);
    CKPTSIM_CHECK(!stopping_, "WorkPool: a task submitted after shutdown");
    (urgent ? urgent_ : ordinary_).push_back(std::move(task));
  }
  cv_.notify_one();
}

void WorkPool::shutdown() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    urgent_.clear();
    ordinary_.clear();
  }
  cv_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void WorkPool::work() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !urgent_.empty() || !ordinary_.empty(); });
      if (stopping_) return;
      auto& queue = urgent_.empty() ? ordinary_ : urgent_;
      task = std::move(queue.front());
      queue.pop_front();
    }
    task();
  }
}

// Shared by a JudgedInOrder and its tasks (invariant 3).
struct JudgedInOrder::State {
  std::function<Judged(int64_t)> make;
  std::atomic<int64_t>* runs = nullptr;
  std::atomic<bool> abandoned{false};
  std::mutex mu;
  std::condition_variable cv;
  // Finished tasks not yet taken: a result, or what the task threw.
  std::map<int64_t, std::pair<std::optional<Judged>, std::exception_ptr>> done;

  // The schedule (under mu). Every submitted task has one pool task that starts whichever task
  // pick() names when a worker runs it, so every submitted task starts exactly once.
  bool dear_first = false;
  int lanes = 0;              // DearFirst::lanes, resolved
  double window = 0;          // how many tasks a prediction of the whole run's cost covers
  std::vector<bool> started;  // by index, for the submitted tasks
  int64_t next_in_order = 0;  // no task below it is unstarted
  // (predicted cost, -index) of the predicted tasks, dearest first (started ones dropped lazily).
  std::priority_queue<std::pair<double, int64_t>> dearest;
  double predicted_sum = 0;
  int64_t predicted = 0;
  int out_of_order_running = 0;
  int64_t starts = 0;  // tasks started so far

  // The task a free worker starts now, and whether it is out of index order.
  // REQUIRES: mu held; a submitted task not yet started.
  std::pair<int64_t, bool> pick_locked(int workers) {
    if (dear_first && out_of_order_running < lanes) {
      while (!dearest.empty() && started[static_cast<size_t>(-dearest.top().second)]) {
        dearest.pop();
      }
      if (!dearest.empty()) {
        const auto [cost, negative_index] = dearest.top();
        const int64_t i = -negative_index;
        const double whole = predicted_sum / static_cast<double>(predicted) * window;
        if (i != next_in_order && cost >= whole / (4.0 * workers)) {
          dearest.pop();
          started[static_cast<size_t>(i)] = true;
          return {i, true};
        }
      }
    }
    while (started[static_cast<size_t>(next_in_order)]) ++next_in_order;
    started[static_cast<size_t>(next_in_order)] = true;
    return {next_in_order, false};
  }
};

JudgedInOrder::JudgedInOrder(WorkPool& pool, int64_t count, int64_t ahead, bool urgent,
                             std::function<Judged(int64_t)> make, std::atomic<int64_t>& runs,
                             std::optional<DearFirst> dear_first)
    : pool_(pool),
      count_(count),
      ahead_(pool.workers() == 0 ? 0 : ahead),
      urgent_(urgent),
      state_(std::make_shared<State>()) {
  CKPTSIM_CHECK(count >= 0 && ahead >= 0, "JudgedInOrder: a negative count");
  state_->make = std::move(make);
  state_->runs = &runs;
  // One worker, or none, has nobody to keep the index order while it runs ahead.
  if (dear_first && dear_first->cost && pool.workers() >= 2) {
    CKPTSIM_CHECK(dear_first->lanes >= 0, "DearFirst: negative lanes");
    cost_ = std::move(dear_first->cost);
    state_->dear_first = true;
    state_->lanes = std::min(dear_first->lanes == 0 ? pool.workers() / 2 : dear_first->lanes,
                             pool.workers() / 2);
    state_->window = static_cast<double>(std::min(count, ahead_ + 1));
  }
}

JudgedInOrder::~JudgedInOrder() { state_->abandoned = true; }

void JudgedInOrder::submit_through(int64_t last) {
  const int64_t end = std::min(last + 1, count_);
  if (submitted_ >= end) return;
  {
    std::lock_guard lock(state_->mu);
    state_->started.resize(static_cast<size_t>(end));
  }
  const int workers = pool_.workers();
  for (; submitted_ < end; ++submitted_) {
    pool_.submit(
        [state = state_, workers] {
          if (state->abandoned) return;
          std::pair<int64_t, bool> pick;
          int64_t started_as = 0;
          {
            std::lock_guard lock(state->mu);
            pick = state->pick_locked(workers);
            if (pick.second) ++state->out_of_order_running;
            started_as = state->starts++;
          }
          ++*state->runs;
          std::pair<std::optional<Judged>, std::exception_ptr> out;
          try {
            out.first = state->make(pick.first);
            out.first->started_as = started_as;
          } catch (...) {
            out.second = std::current_exception();
          }
          {
            std::lock_guard lock(state->mu);
            state->done.emplace(pick.first, std::move(out));
            if (pick.second) --state->out_of_order_running;
          }
          state->cv.notify_all();
        },
        urgent_);
  }
}

void JudgedInOrder::predict_submitted() {
  constexpr int64_t kBatch = 16;  // predictions published together
  while (predicted_ < submitted_ && !state_->abandoned) {
    const int64_t end = std::min(predicted_ + kBatch, submitted_);
    std::vector<std::pair<double, int64_t>> batch;
    for (int64_t i = predicted_; i < end; ++i) batch.emplace_back(std::max(0.0, cost_(i)), -i);
    std::lock_guard lock(state_->mu);
    for (const auto& [cost, negative_index] : batch) {
      state_->predicted_sum += cost;
      if (!state_->started[static_cast<size_t>(-negative_index)]) {
        state_->dearest.emplace(cost, negative_index);
      }
    }
    state_->predicted += end - predicted_;
    predicted_ = end;
  }
}

int64_t JudgedInOrder::predictions_published() const {
  std::lock_guard lock(state_->mu);
  return state_->predicted;
}

Judged JudgedInOrder::take(int64_t i) {
  CKPTSIM_CHECK(i >= 0 && i < count_, "JudgedInOrder::take: index out of range");
  submit_through(i + ahead_);
  if (cost_) predict_submitted();
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done.contains(i); });
  auto node = state_->done.extract(i);
  // Results before i were taken or skipped; none is kept (the map stays bounded by `ahead`).
  state_->done.erase(state_->done.begin(), state_->done.lower_bound(i));
  lock.unlock();
  if (node.mapped().second) std::rethrow_exception(node.mapped().second);
  return std::move(*node.mapped().first);
}

}  // namespace ckptsim::search
