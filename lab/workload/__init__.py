"""workload"""

# What a run's web + senders were (run.json "harness"; the analysis never pools two kinds):
# the senders' default client, the web's default insert listener, the control listener's process.
HARNESS = "raw senders, raw insert listener, control process"
HARNESS_BEFORE = "aiohttp senders, aiohttp web, one process"  # runs stored before the field
