"""Fault injection: hooks killed, paused and raced at their step boundaries (pytest marker ``faults``)."""
