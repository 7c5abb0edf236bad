"""Keeping a stage alive: the supervisor runs attempts through a launch back end (`launch`), reads
heartbeats, restarts from the newest whole checkpoint, runs torchft replica groups (`replicas`),
relays remote rank 0's metrics, and turns loss spikes (`spikes`) into proposals a person approves."""
