"""Infrastructure shared by the algorithm files: environments, CLI, logging,
checkpoints, the chunked host loop, plots. No losses, targets or networks."""
