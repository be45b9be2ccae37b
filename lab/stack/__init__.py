"""Native and compose stacks behind one interface."""
