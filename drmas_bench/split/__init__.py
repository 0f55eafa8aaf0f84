"""One evaluation split over N worker processes (or Ray actors), writing one run directory.

    drmas-bench eval --model M --suite search --workers 4                # 4 spawned processes
    drmas-bench eval --model M --suite search --workers 4 --pool ray     # 4 Ray actors (--ray-address: a cluster)

The coordinating process (the one the command runs in) keeps everything the one-process run has:
the plan, the run directory with its lock and index, the resume check, the recorder (its grading and
writing threads, one fsync per batch), the progress bar and the summary. Only playing the episodes
moves: each worker builds the team's engines, the retriever and the call cache from the plan (a
model per worker, as one process per GPU) and plays the (question, sample) pairs it is dealt with
``runner.play``, the one-process run's own function. The coordinator lists the pending pairs once
(a resumed run skips the finished ones, as always) and deals them as the runner asks for them, each
to the worker with the fewest outstanding, so a slow worker holds nothing up; each finished
trajectory comes back and is recorded exactly as in one process. Every call's seed derives from the
run seed and the (task, sample, agent, turn), so a record does not depend on the worker that played
it (the hf engine: as far as a completion does not depend on its batch, docs/eval.md).

What one process promises stays true: SIGTERM (or Ctrl-C) stops the coordinator as it stops a
one-process run (the workers ignore it and are told to stop), every finished episode that came back
is written, and the same command resumes. A worker that dies (or cannot start) is one line naming
it; what finished is on disk and the same command, with any number of workers, resumes. How the run
was split is provenance (config.yaml's and summary.json's ``eval_config.workers``, summary.json's
``pool.split``), never part of the run's identity. Spending limits need one process (refused).

- ``coordinator.py``: ``run_split``, the ``Dispatcher`` the runner plays through, the process and Ray hosts;
- ``worker.py``: ``WorkerCore`` (the engines and episodes of one worker), ``process_main``, ``SplitActor``.
"""

from drmas_bench.split.coordinator import Dispatcher, run_split

__all__ = ["Dispatcher", "run_split"]
