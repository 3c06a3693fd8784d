"""The launching machine: machine facts, the controller, ``--check``, and the runners."""
