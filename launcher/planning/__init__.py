"""Pure planning, no I/O: hostfile, filters, env policy, the launch plan and its renderings."""
