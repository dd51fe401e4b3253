#include "bench/tune_supervisor.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "qgemm/error.hpp"

extern char** environ;

namespace qgemm::bench {
namespace {

using Clock = std::chrono::steady_clock;

// A running worker: its pid and the read end of its stdout.
struct Worker {
  pid_t pid = -1;
  int out = -1;
};

Worker start_worker(const SupervisorOptions& options, std::size_t from) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0)
    throw Error(ErrorCode::IoError, fmt::format("tune: pipe: {}", std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[1]);
  std::vector<std::string> args = options.worker_command(from);
  require(!args.empty(), "tune: the worker command is empty");
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  Worker worker;
  const int error = posix_spawn(&worker.pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  if (error != 0) {
    ::close(pipe_fds[0]);
    throw Error(ErrorCode::IoError,
                fmt::format("tune: cannot start the worker process: {}", std::strerror(error)));
  }
  worker.out = pipe_fds[0];
  return worker;
}

struct WorkerEnd {
  bool context_lost = false;  // it exited on purpose after reporting its last task
  std::string text;           // how it ended, for messages
};

// Waits for the worker to exit (killing it first when asked).
WorkerEnd reap(Worker& worker, bool kill_it) {
  if (kill_it) ::kill(worker.pid, SIGKILL);
  int status = 0;
  while (::waitpid(worker.pid, &status, 0) < 0 && errno == EINTR) {
  }
  ::close(worker.out);
  worker = {};
  if (WIFSIGNALED(status)) return {false, fmt::format("killed by signal {}", WTERMSIG(status))};
  return {WEXITSTATUS(status) == kWorkerContextLost,
          fmt::format("exit status {}", WEXITSTATUS(status))};
}

}  // namespace

std::vector<CandidateResult> supervise_tuning(const std::vector<TuneTask>& tasks,
                                              const SupervisorOptions& options) {
  std::vector<CandidateResult> results(tasks.size());
  std::size_t next = 0;  // the first task without a result
  auto record = [&](std::size_t index, CandidateResult result) {
    results[index] = std::move(result);
    next = index + 1;
    if (options.progress) options.progress(next, tasks.size());
  };
  while (next < tasks.size()) {
    Worker worker = start_worker(options, next);
    std::string buffer;
    bool compiled = false;
    auto phase_started = Clock::now();
    bool finished = false;
    while (!finished) {
      const double limit = compiled ? options.deadline_s : options.compile_deadline_s;
      const double left =
          limit - std::chrono::duration<double>(Clock::now() - phase_started).count();
      if (left <= 0) {
        const WorkerEnd end = reap(worker, /*kill_it=*/true);
        CandidateResult hang;
        hang.status = CandidateStatus::Hang;
        hang.reason =
            fmt::format("no result within {:.0f} s {} (worker {})", limit,
                        compiled ? "of its timed part" : "of compiling and preparing", end.text);
        record(next, hang);
        break;
      }
      pollfd descriptor{worker.out, POLLIN, 0};
      const int ready = ::poll(&descriptor, 1, static_cast<int>(std::min(left, 1.0) * 1000) + 1);
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) continue;
      char chunk[4096];
      const ssize_t got = ::read(worker.out, chunk, sizeof chunk);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {  // the worker closed its stdout: it exited
        const WorkerEnd end = reap(worker, /*kill_it=*/false);
        // After a context-breaking error it has reported its task already; otherwise it died
        // during task `next` (a crash), which is that candidate's result.
        if (!end.context_lost && next < tasks.size()) {
          CandidateResult died;
          died.status = CandidateStatus::Failed;
          died.reason =
              fmt::format("the worker process ended during this candidate ({})", end.text);
          record(next, died);
        }
        break;
      }
      buffer.append(chunk, static_cast<std::size_t>(got));
      for (std::size_t end; (end = buffer.find('\n')) != std::string::npos;) {
        const std::string line = buffer.substr(0, end);
        buffer.erase(0, end + 1);
        // Anything else on the worker's stdout (a library printing there) is passed on to
        // stderr, never taken for a result.
        WorkerMessage message;
        try {
          message = parse_worker_line(line);
        } catch (const Error& error) {
          std::fprintf(stderr, "qgemm tune: worker: %s\n", line.c_str());
          continue;
        }
        if (message.task != next) {
          std::fprintf(stderr, "qgemm tune: worker reported task %zu while %zu was due: %s\n",
                       message.task, next, line.c_str());
          continue;
        }
        if (message.compiled) {
          compiled = true;
        } else {
          record(next, *message.result);
          compiled = false;
        }
        phase_started = Clock::now();
      }
      if (next >= tasks.size()) {
        reap(worker, /*kill_it=*/false);
        finished = true;
      }
    }
  }
  return results;
}

}  // namespace qgemm::bench
