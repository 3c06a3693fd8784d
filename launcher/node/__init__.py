"""What runs on every node: the agent, rank environments, the supervisor, process handling."""
