"""Running a whole experiment on this machine: the launcher and its stage processes, warm-start,
the progress display and summary, and the compare and sweep drivers built on them."""
