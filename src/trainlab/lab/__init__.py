"""`trainlab lab`: the lab's deliverables as budgeted, resumable steps sized to the hardware."""
