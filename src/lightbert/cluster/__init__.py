"""Processes and clusters: which process is the job's first (Lightning's, torchelastic's or SLURM's numbering), the
run's child processes, signals outside training, and a rank that died."""
