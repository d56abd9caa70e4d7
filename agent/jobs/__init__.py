"""The ML jobs of a node: real child processes (JobManager) or a cheap simulation.

    table       the jobs the node owns (JobRecord, JobTable in <agent state>/jobs.json) and
                the configured ones (AGENT_JOBS)
    runner      what the report and the job actions drive (JobSource, JobRunner) and see
                (JobView, LocalCheckpoint), and the mode rule every source follows (wanted)
    simulated   jobs without processes, for large fleets (SimulatedJobs)
    processes   jobs as child processes under a supervisor (JobSpec, JobManager)

Every public name is importable from here as well as from its module.
"""

from agent.jobs.processes import (
    JOB_MODULES,
    JOBS_DIR,
    LOG_FILE,
    MAX_THROUGHPUT,
    PID_FILE,
    REPO_ROOT,
    JobManager,
    JobSpec,
    ManagedJob,
    job_args,
    job_dir,
    job_specs,
)
from agent.jobs.runner import JobRunner, JobSource, JobState, JobView, LocalCheckpoint, wanted
from agent.jobs.simulated import (
    INFERENCE_THROUGHPUT,
    SIM_STEPS_PER_RUN,
    SIM_STEPS_PER_S,
    TRAINING_RUN_S,
    SimJob,
    SimulatedJobs,
)
from agent.jobs.table import (
    JOB_TYPES,
    MAX_GONE,
    TABLE_FILE,
    JobKind,
    JobRecord,
    JobTable,
    configured_records,
    gpu_for,
)

__all__ = [
    "INFERENCE_THROUGHPUT",
    "JOBS_DIR",
    "JOB_MODULES",
    "JOB_TYPES",
    "LOG_FILE",
    "MAX_GONE",
    "MAX_THROUGHPUT",
    "PID_FILE",
    "REPO_ROOT",
    "SIM_STEPS_PER_RUN",
    "SIM_STEPS_PER_S",
    "TABLE_FILE",
    "TRAINING_RUN_S",
    "JobKind",
    "JobManager",
    "JobRecord",
    "JobRunner",
    "JobSource",
    "JobSpec",
    "JobState",
    "JobTable",
    "JobView",
    "LocalCheckpoint",
    "ManagedJob",
    "SimJob",
    "SimulatedJobs",
    "configured_records",
    "gpu_for",
    "job_args",
    "job_dir",
    "job_specs",
    "wanted",
]
