"""`board report`: booked GPU-hours against used ones, per user, class, pool or card, with the seeds' verdicts."""
