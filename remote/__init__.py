"""Remote clusters: profiles, SSH, preflight, bundles, launchers, jobs, tracking.

    cluster.py      profiles in the config dir (LAYERFLOW_CONFIG_DIR, changed under a file lock), ~/.ssh/config import
    ssh.py          Connection: lazy, host keys pinned only with consent, timeouts everywhere
    preflight.py    parallel per-host checks, nvidia-smi parsing, rendezvous port, device_spec
    bundle.py       run folder + runtime as a content-hashed tar; upload only when missing
    launch_ssh.py   prepare + deploy: detached torchrun per node (c10d on the first)
    launch_slurm.py sbatch script with srun torchrun
    jobs.py         the local job database (SQLite) and each job's local mirror folder
    tracker.py      state, metrics and logs by byte offset through faults; cancel; fetch
    jobctl.py       the node-side helper shipped in every bundle (stdlib only)
    launch_local.py torchrun on this machine (the distributed runtime's launcher)
    procs.py        a local run's process tree (psutil) and its one stop/kill path
No Qt here: app/cli/remote_cmds.py, app/cluster_dialog.py and app/jobs_panel.py are the faces.
"""
