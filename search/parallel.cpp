#include "search/parallel.h"

#include <map>

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
};

JudgedInOrder::JudgedInOrder(WorkPool& pool, int64_t count, int64_t ahead, bool urgent,
                             std::function<Judged(int64_t)> make, std::atomic<int64_t>& runs)
    : pool_(pool),
      count_(count),
      ahead_(pool.workers() == 0 ? 0 : ahead),
      urgent_(urgent),
      state_(std::make_shared<State>()) {
  CKPTSIM_CHECK(count >= 0 && ahead >= 0, "JudgedInOrder: a negative count");
  state_->make = std::move(make);
  state_->runs = &runs;
}

JudgedInOrder::~JudgedInOrder() { state_->abandoned = true; }

void JudgedInOrder::submit_through(int64_t last) {
  for (; submitted_ <= last && submitted_ < count_; ++submitted_) {
    pool_.submit(
        [state = state_, i = submitted_] {
          if (state->abandoned) return;
          ++*state->runs;
          std::pair<std::optional<Judged>, std::exception_ptr> out;
          try {
            out.first = state->make(i);
          } catch (...) {
            out.second = std::current_exception();
          }
          {
            std::lock_guard lock(state->mu);
            state->done.emplace(i, std::move(out));
          }
          state->cv.notify_all();
        },
        urgent_);
  }
}

Judged JudgedInOrder::take(int64_t i) {
  CKPTSIM_CHECK(i >= 0 && i < count_, "JudgedInOrder::take: index out of range");
  submit_through(i + ahead_);
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
