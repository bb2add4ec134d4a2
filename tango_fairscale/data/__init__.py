"""Token queries, model batches (padded or packed) and batch schedules."""
